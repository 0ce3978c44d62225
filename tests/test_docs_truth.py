"""What the pages name exists, and what the code's messages point at is there.

- Every package path the README, the docs' pages, the changelog and the example's README
  name (``scrapy_redis_bloom/transport/node.py``, ``engine/lifecycle.py``,
  ``scrapy_redis_bloom.scrapy.stats.STATS``, ``ops.dump.dump_filter``) exists or imports,
  and every ``Class.attribute`` of the package they name has that attribute.
- The README's links to files of the repository resolve, anchors included (on the package
  index they are made absolute; Sphinx checks the docs' own links with ``-W``).
- Every message the package shows a user that points at a page (``docs/howto/x.md#anchor``)
  points at a page and an anchor that exist; none points at a README section (those moved
  to the docs), except the ones listed in :data:`PENDING`, which wait for their files'
  owners.
- Every error class the package raises to users has its section in
  ``docs/howto/troubleshooting.md``.
- The figures of the default sizing the FAQ states are the code's, and so are the largest
  filter and the defaults the pages give in passing (```BLOOMFILTER_EXPANSION``, default 2``).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from functools import cache
from pathlib import Path

import pytest

import scrapy_redis_bloom
from scrapy_redis_bloom.core.errors import BloomFilterError
from scrapy_redis_bloom.core.settings import MAX_BIT, SETTINGS, BloomConfig
from scrapy_redis_bloom.core.sizing import false_positive_rate, format_bytes

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "scrapy_redis_bloom"
DOCS = ROOT / "docs"
#: The package's folders, as the docs name paths inside it (``engine/base.py``).
LAYERS = ("core", "engine", "transport", "ops", "cli", "scrapy")
TROUBLESHOOTING = DOCS / "howto" / "troubleshooting.md"

#: Messages that still point at a README section, in files whose owners change them:
#: (file, the pointer as the message says it) -> the docs page it should name instead.
PENDING: dict[tuple[str, str], str] = {}

#: Error classes users never see: the transport's outcomes, which the executor turns into
#: the filter's errors (docs/architecture.md), and the CLI's, which it prints as a line.
INTERNAL_ERRORS = {
    "TransportError": "classified by transport/executor.py, never raised past it",
    "NotSentError": "classified by transport/executor.py, never raised past it",
    "ReplyLostError": "classified by transport/executor.py, never raised past it",
    "RefusedError": "classified by transport/executor.py, never raised past it",
    "CLIError": "printed by scrapy bloom as its one-line error, with an exit status",
    "UsageError": "printed by scrapy bloom as its usage error, with an exit status",
    "BadLineError": "a bad input line of scrapy bloom add/check, reported with its number",
}
#: Error classes users meet that do not derive from BloomFilterError.
OTHER_USER_ERRORS = ("UnsupportedVersionError", "DumpFileError", "ValueError")

#: Classes of other libraries the pages name with an attribute (``Sentinel.close()``).
FOREIGN_CLASSES = {"Sentinel"}


def pages() -> list[Path]:
    """Return the pages that name package paths."""
    docs = [
        path
        for path in sorted(DOCS.rglob("*.md"))
        if not {"_build", "generated"} & set(path.relative_to(DOCS).parts)
    ]
    return [
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        ROOT / "example_project" / "README.md",
        *docs,
    ]


def where(path: Path, text: str, at: int) -> str:
    return f"{path.relative_to(ROOT)} line {text.count(chr(10), 0, at) + 1}"


def resolves(dotted: str) -> bool:
    """Tell whether ``a.b.c.Name.attr`` imports: the longest module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


@cache
def package_modules() -> list[str]:
    names = [scrapy_redis_bloom.__name__]
    prefix = scrapy_redis_bloom.__name__ + "."
    names += [m.name for m in pkgutil.walk_packages(scrapy_redis_bloom.__path__, prefix)]
    return names


@cache
def package_classes() -> dict[str, list[type]]:
    """Return every class the package defines, by name."""
    found: dict[str, list[type]] = {}
    for name in package_modules():
        for value in vars(importlib.import_module(name)).values():
            ours = inspect.isclass(value) and value.__module__.startswith("scrapy_redis_bloom")
            if ours and value not in found.setdefault(value.__name__, []):
                found[value.__name__].append(value)
    return found


def test_every_package_path_the_pages_name_exists() -> None:
    wrong = []
    for path in pages():
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"scrapy_redis_bloom(/[\w/.-]*\w\.(?:py|lua))", text):
            if not (PACKAGE / match[1].lstrip("/")).is_file():
                wrong.append(f"{where(path, text, match.start())}: {match[0]} is no file")
        layers = "|".join(LAYERS)
        for match in re.finditer(rf"(?<![\w/.-])((?:{layers})/[\w/]*\w\.(?:py|lua))", text):
            if not (PACKAGE / match[1]).is_file():
                wrong.append(f"{where(path, text, match.start())}: {match[1]} is no package file")
        for match in re.finditer(
            r"(?<![\w/.-])((?:bench|tests|example_project)/[\w/.-]*\w\.py)", text
        ):
            if not (ROOT / match[1]).is_file():
                wrong.append(f"{where(path, text, match.start())}: {match[1]} is no file")
        for match in re.finditer(r"scrapy_redis_bloom(?:\.\w+)+", text):
            dotted = match[0]
            if not dotted.endswith((".py", ".lua", ".md")) and not resolves(dotted):
                wrong.append(f"{where(path, text, match.start())}: {dotted} does not import")
        for match in re.finditer(rf"`((?:{'|'.join(LAYERS[:5])})\.[\w.]*\w)`", text):
            if not resolves(f"scrapy_redis_bloom.{match[1]}"):
                wrong.append(f"{where(path, text, match.start())}: {match[1]} does not import")
    assert not wrong, "\n".join(wrong)


def test_every_class_attribute_the_pages_name_exists() -> None:
    """``FilterBase.check_and_add``, ``Executor.run``: the class has it."""
    classes = package_classes()
    wrong = []
    for path in pages():
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"`(?:[\w/.]+ )?([A-Z]\w*)\.([a-z_]\w*)(?:\(\))?`", text):
            name, attribute = match[1], match[2]
            if attribute == "md" or name in FOREIGN_CLASSES:
                continue
            if name not in classes:
                wrong.append(f"{where(path, text, match.start())}: no class {name} in the package")
            elif not any(hasattr(cls, attribute) for cls in classes[name]):
                wrong.append(f"{where(path, text, match.start())}: {name} has no {attribute}")
    assert not wrong, "\n".join(wrong)


# -- anchors of pages ---------------------------------------------------------------------


def slug(heading: str) -> str:
    """Return the anchor MyST (and GitHub) give a heading: lower case, dashes for spaces."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", text))


def anchors(page: Path) -> set[str]:
    """Return the anchors of a Markdown page: its headings' and its MyST labels."""
    found = set()
    fence = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        if fence:
            continue
        if heading := re.match(r"^#{1,6} +(.+?) *#*$", line):
            found.add(slug(heading[1]))
        if label := re.match(r"^\(([\w-]+)\)=$", line):
            found.add(label[1])
    return found


def test_slug_is_mysts() -> None:
    assert slug("Layouts: classic, blocked, native") == "layouts-classic-blocked-native"
    assert slug("`ConfigMismatchError`") == "configmismatcherror"
    assert (
        slug("Past capacity: what a grown filter means")
        == "past-capacity-what-a-grown-filter-means"
    )


def test_readme_links_resolve() -> None:
    """The README's relative links name files of the repository, and anchors on them."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    wrong = []
    for match in re.finditer(r"\]\(([^)\s]+)\)", text):
        target = match[1]
        if "://" in target or target.startswith("mailto:"):
            continue
        file, _, anchor = target.partition("#")
        page = ROOT / file if file else ROOT / "README.md"
        if not page.exists():
            wrong.append(f"{where(ROOT / 'README.md', text, match.start())}: {file} does not exist")
        elif anchor and anchor not in anchors(page):
            wrong.append(
                f"{where(ROOT / 'README.md', text, match.start())}: no #{anchor} in {file}"
            )
    assert not wrong, "\n".join(wrong)


# -- what the code's messages point at ------------------------------------------------------


def message_strings() -> list[tuple[str, int, str]]:
    """Return (file, line, text) of every string the package's code holds but docstrings."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                body = node.body
                if (
                    body
                    and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant)
                ):
                    docstrings.add(id(body[0].value))
        relative = path.relative_to(ROOT).as_posix()
        for node in ast.walk(tree):
            text = isinstance(node, ast.Constant) and isinstance(node.value, str)
            if text and id(node) not in docstrings:
                found.append((relative, node.lineno, node.value))
    return found


def test_messages_point_at_pages_and_anchors_that_exist() -> None:
    wrong = []
    pointed = 0
    for file, line, text in message_strings():
        for match in re.finditer(r"docs/([\w/.-]+\.md)(?:#([\w-]+))?", text):
            pointed += 1
            page = DOCS / match[1]
            if not page.is_file():
                wrong.append(f"{file} line {line}: {match[0]}: no such page")
            elif match[2] and match[2] not in anchors(page):
                wrong.append(f"{file} line {line}: {match[0]}: no #{match[2]} on that page")
    assert not wrong, "\n".join(wrong)
    assert pointed >= 3  # the monitors' and the CLI's, at least


def test_no_message_points_at_a_readme_section() -> None:
    """The README's sections moved to the docs: a message names the page instead."""
    found = set()
    wrong = []
    for file, line, text in message_strings():
        for match in re.finditer(r"(?:see )?README(?:[,:]? ?'[^']+'|, \w+|: \w+)?", text):
            if (file, match[0]) in PENDING:
                found.add((file, match[0]))
            else:
                wrong.append(f"{file} line {line}: {text.strip()!r}")
    assert not wrong, "messages point at the README; name a docs page:\n" + "\n".join(wrong)
    fixed = set(PENDING) - found
    assert not fixed, f"fixed, remove them from PENDING: {sorted(fixed)}"
    for page in PENDING.values():
        file, _, anchor = page.partition("#")
        assert anchor in anchors(ROOT / file), page


# -- every error has its entry ------------------------------------------------------------


def user_errors() -> set[str]:
    """Return the names of the exception classes the package defines, users' and internal."""
    return {
        name
        for name, found in package_classes().items()
        if any(issubclass(cls, BaseException) for cls in found)
    }


def test_every_error_has_a_troubleshooting_entry() -> None:
    errors = user_errors()
    unclassified = {
        name
        for name in errors - set(INTERNAL_ERRORS)
        if not any(issubclass(c, BloomFilterError) for c in package_classes()[name])
        and name not in OTHER_USER_ERRORS
    }
    assert not unclassified, (
        f"error classes neither users' (BloomFilterError, OTHER_USER_ERRORS) nor internal"
        f" (INTERNAL_ERRORS): {sorted(unclassified)}"
    )
    assert set(INTERNAL_ERRORS) <= errors, set(INTERNAL_ERRORS) - errors
    sections = anchors(TROUBLESHOOTING)
    missing = sorted(
        name
        for name in (errors - set(INTERNAL_ERRORS)) | set(OTHER_USER_ERRORS)
        if slug(name) not in sections
    )
    assert not missing, f"{TROUBLESHOOTING.relative_to(ROOT)} has no section for {missing}"
    # Each section says when it happens and what to do.
    text = TROUBLESHOOTING.read_text(encoding="utf-8")
    for name in (errors - set(INTERNAL_ERRORS)) | set(OTHER_USER_ERRORS):
        section = text.split(f"### {name}\n", 1)[1].split("\n#", 1)[0]
        assert "**When.**" in section, name
        assert "**What to do.**" in section, name


@pytest.mark.parametrize("name", sorted(INTERNAL_ERRORS))
def test_internal_errors_are_not_exported(name: str) -> None:
    assert name not in scrapy_redis_bloom.__all__


# -- figures the pages state -------------------------------------------------------------------


def test_the_faqs_default_sizing() -> None:
    """The FAQ's "What if I set no size at all?": the figures are the default filter's."""
    text = re.sub(r"\s+", " ", (DOCS / "howto" / "faq.md").read_text(encoding="utf-8"))
    config = BloomConfig.from_settings({})
    spec = config.spec
    rate = false_positive_rate(spec.bits, spec.hash_count, config.capacity, spec.block_bits)
    said = (
        f"with k = {spec.hash_count}, {format_bytes(spec.total_bytes)} of Redis, a"
        f" {100 * rate:.1f}% false-positive rate at its capacity of {config.capacity:,} URLs"
    )
    assert said in text, said
    assert 2**30 <= spec.bits <= 1.02 * 2**30
    # The README's "without the two sizing lines".
    readme = re.sub(r"\s+", " ", (ROOT / "README.md").read_text(encoding="utf-8"))
    said = (
        f"it takes {format_bytes(spec.total_bytes)} and reaches a {100 * rate:.1f}%"
        f" false-positive rate at {round(config.capacity / 1e6)} million URLs"
    )
    assert said in readme, said


def test_the_largest_filter() -> None:
    """How the filter works: "m may go to 2**47 bits", the largest BLOOMFILTER_BIT."""
    for path in pages():
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"m may go to 2\*\*(\d+) bits", text):
            assert int(match[1]) == MAX_BIT, where(path, text, match.start())


def test_defaults_given_in_passing() -> None:
    """```BLOOMFILTER_X`` (default 2)`` in the prose is the setting's default."""
    defaults = {setting.name: setting.default for setting in SETTINGS}
    wrong = []
    for path in pages():
        text = path.read_text(encoding="utf-8")
        pattern = r"`(BLOOMFILTER_[A-Z_]+)`,? \(?default:? `?(\d+(?:\.\d+)?|True|False)\b"
        for match in re.finditer(pattern, text):
            name, said = match[1], match[2]
            default = defaults[name]
            same = (
                str(default) == said
                if default is None or isinstance(default, bool | str)
                else float(said) == default
            )
            if not same:
                wrong.append(f"{where(path, text, match.start())}: {name} defaults to"
                             f" {defaults[name]!r}, not {said}")  # fmt: skip
    assert not wrong, "\n".join(wrong)

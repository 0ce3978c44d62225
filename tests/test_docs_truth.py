"""What the pages name exists, and what the code's messages point at is there.

- Every package path the README, the docs' pages, the changelog and the example's README
  name (``scrapy_redis_bloom/transport/node.py``, ``engine/lifecycle.py``,
  ``scrapy_redis_bloom.scrapy.stats.STATS``, ``ops.dump.dump_filter``) exists or imports,
  and every ``Class.attribute`` of the package they name has that attribute.
- The README's links to files of the repository are absolute (to the project's Source URL,
  so that they resolve on the package index too) and name files and headings that exist;
  Sphinx checks the docs' own links with ``-W``.
- Every message the package shows a user that points at a page (``docs/howto/x.md#anchor``)
  points at a page and an anchor that exist; none points at a README section (those moved
  to the docs), except the ones listed in :data:`PENDING`, which wait for their files'
  owners.
- Every error class the package raises to users has its section in
  ``docs/howto/troubleshooting.md``.
- The figures of the default sizing the FAQ states are the code's, and so are the largest
  filter and the defaults the pages give in passing (```BLOOMFILTER_EXPANSION``, default 2``).
- Every benchmark figure README.md and docs/index.md state (``2.0x a SADD``) is the
  committed run's (bench/results.json, and bench/states-results.json for the filter's
  states), within the rounding the page writes it with; a ratio in their prose that is no
  known figure of the run fails too, and each page names the run.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import itertools
import math
import pkgutil
import re
import sys
from functools import cache
from pathlib import Path

import pytest

import scrapy_redis_bloom
from scrapy_redis_bloom.core.errors import BloomFilterError
from scrapy_redis_bloom.core.settings import BLOCKED, MAX_BIT, SETTINGS, BloomConfig
from scrapy_redis_bloom.core.sizing import false_positive_rate, format_bytes, layout_costs

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
    "SwitchedError": "a NotSentError (a session's connection replaced), never raised past it",
    "ReplyLostError": "classified by transport/executor.py, never raised past it",
    "RefusedError": "classified by transport/executor.py, never raised past it",
    "CLIError": "printed by scrapy bloom as its one-line error, with an exit status",
    "UsageError": "printed by scrapy bloom as its usage error, with an exit status",
    "BadLineError": "a bad input line of scrapy bloom add/check, reported with its number",
    "RefusedLineError": "a URL Request refuses, read_lines turns it into a BadLineError",
    "WordedError": "the base of BloomFilterError and SettingError, never raised itself",
    "ScannedKeyGoneError": "caught by scrapy bloom migrate, printed as its one-line error",
}
#: Error classes users meet whose troubleshooting section is another's (exported all the same).
COVERED_BY = {"SettingError": "ValueError"}  # a ValueError naming settings
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


def anchors(page: Path, labels: bool = True) -> set[str]:
    """Return the anchors of a Markdown page: its headings' and (``labels``) its MyST labels.

    GitHub gives a page its headings' anchors only.
    """
    found = set()
    fence = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        if fence:
            continue
        if heading := re.match(r"^#{1,6} +(.+?) *#*$", line):
            found.add(slug(heading[1]))
        if labels and (label := re.match(r"^\(([\w-]+)\)=$", line)):
            found.add(label[1])
    return found


def test_slug_is_mysts() -> None:
    assert slug("Layouts: classic, blocked, native") == "layouts-classic-blocked-native"
    assert slug("`ConfigMismatchError`") == "configmismatcherror"
    assert (
        slug("Past capacity: what a grown filter means")
        == "past-capacity-what-a-grown-filter-means"
    )


def repository_files_url() -> str:
    """Return where the repository's files are read on the web: the project's Source URL."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return project["urls"]["Source"].rstrip("/") + "/blob/main/"


def readme_link_problems(text: str) -> list[str]:
    """Return the README's links that lead nowhere on the package index or on GitHub.

    The package index shows the README alone: a relative link (``docs/howto/x.md``) leads
    nowhere there, so a link into the repository is absolute, to the project's Source URL
    (``.../blob/main/docs/howto/x.md``); it must name a file of this checkout, and an
    anchor one of that page's headings (GitHub knows no MyST labels).
    """
    base = repository_files_url()
    wrong = []
    for match in re.finditer(r"\]\(([^)\s]+)\)", text):
        target = match[1]
        at = where(ROOT / "README.md", text, match.start())
        if not target.startswith(base):
            if "://" not in target and not target.startswith("mailto:"):
                wrong.append(f"{at}: {target} is relative: on the package index it leads"
                             f" nowhere; link {base}{target}")  # fmt: skip
            continue
        file, _, anchor = target.removeprefix(base).partition("#")
        page = ROOT / file
        if not page.is_file():
            wrong.append(f"{at}: {file} does not exist")
        elif anchor and anchor not in anchors(page, labels=False):
            wrong.append(f"{at}: no heading #{anchor} in {file}")
    return wrong


def test_readme_links_resolve() -> None:
    """The README's links into the repository are absolute, to files and headings that exist."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert not readme_link_problems(text), "\n".join(readme_link_problems(text))
    assert text.count(repository_files_url() + "docs/") >= 10


def test_a_relative_readme_link_fails() -> None:
    """A relative link into docs/, a missing page or a MyST label as anchor is found."""
    base = repository_files_url()
    assert readme_link_problems("[a](docs/howto/faq.md)")
    assert not readme_link_problems(f"[a]({base}docs/howto/faq.md)")
    assert readme_link_problems(f"[a]({base}docs/howto/no-such-page.md)")
    assert readme_link_problems(f"[a]({base}docs/explanation/growth.md#past-capacity)")
    assert not readme_link_problems("[a](https://github.com/rmax/scrapy-redis)")


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
        and name not in COVERED_BY
    }
    assert not unclassified, (
        f"error classes neither users' (BloomFilterError, OTHER_USER_ERRORS) nor internal"
        f" (INTERNAL_ERRORS): {sorted(unclassified)}"
    )
    assert set(INTERNAL_ERRORS) <= errors, set(INTERNAL_ERRORS) - errors
    sections = anchors(TROUBLESHOOTING)
    sectioned = (errors - set(INTERNAL_ERRORS) - set(COVERED_BY)) | set(OTHER_USER_ERRORS)
    missing = sorted(name for name in sectioned if slug(name) not in sections)
    assert set(COVERED_BY.values()) <= sectioned, COVERED_BY
    assert not missing, f"{TROUBLESHOOTING.relative_to(ROOT)} has no section for {missing}"
    # Each section says when it happens and what to do.
    text = TROUBLESHOOTING.read_text(encoding="utf-8")
    for name in sectioned:
        section = text.split(f"### {name}\n", 1)[1].split("\n#", 1)[0]
        assert "**When.**" in section, name
        assert "**What to do.**" in section, name


def test_every_users_error_is_importable_from_the_package() -> None:
    """The API page and troubleshooting say so: ``from scrapy_redis_bloom import X``."""
    users = (user_errors() - set(INTERNAL_ERRORS)) | set(OTHER_USER_ERRORS)
    missing = sorted(
        name
        for name in users
        if name not in scrapy_redis_bloom.__all__ and name not in dir(builtins)
    )
    assert not missing, f"errors users meet that scrapy_redis_bloom does not export: {missing}"


@pytest.mark.parametrize("name", sorted(INTERNAL_ERRORS))
def test_internal_errors_are_not_exported(name: str) -> None:
    assert name not in scrapy_redis_bloom.__all__


# -- figures the pages state -------------------------------------------------------------------


def test_the_blocked_settings_schemes_are_what_a_new_filter_gets() -> None:
    # It said False gave "the classic (unblocked, scheme 1) layout": a new one has scheme 3.
    meaning = BLOCKED.meaning
    for blocked, said in (
        (True, r"one 512-bit block \(hash scheme (\d)\)"),
        (False, r"`False`: the classic \(unblocked\) layout, hash scheme (\d) for a new filter"),
    ):
        found = re.search(said, meaning)
        assert found, (said, meaning)
        spec = BloomConfig.from_settings({"BLOOMFILTER_BLOCKED": blocked}).spec
        assert int(found.group(1)) == spec.scheme


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


# -- the benchmark's figures the README and the docs' front page state ------------------------

BENCH = ROOT / "bench"
#: A figure as the pages write it: ``2.0``, ``0.13-0.14`` (a range), ``1,000``.
NUMBER = r"(\d[\d,]*(?:\.\d+)?(?:-\d[\d,]*(?:\.\d+)?)?)"
#: A ratio in the prose: ``2.0x``, ``0.34-0.40x``.
RATIO = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s?[xx](?![\w])")


@cache
def bench_run(name: str) -> dict[str, object]:
    import json

    run: dict[str, object] = json.loads((BENCH / name).read_text(encoding="utf-8"))
    return run


def bench_row(name: str, measure: str, contender: str) -> dict[str, object]:
    rows = [
        row
        for row in bench_run(name)["rows"]  # type: ignore[attr-defined]
        if row["measure"] == measure and row["contender"] == contender
    ]
    assert len(rows) == 1, f"bench/{name}: {len(rows)} rows ({measure!r}, {contender!r})"
    return rows[0]


def median(measure: str, contender: str, name: str = "results.json") -> float:
    return float(bench_row(name, measure, contender)["median"])  # type: ignore[arg-type]


def over(measure: str, ours: str, peer: str, name: str = "results.json") -> float:
    """Return ``ours`` / ``peer``, the medians of one measure of one run."""
    return median(measure, ours, name) / median(measure, peer, name)


def per_round(measure: str, contender: str) -> float:
    """Return the ratio a row's comparison gives (the median of the ratios within rounds)."""
    comparison = str(bench_row("results.json", measure, contender)["comparison"])
    found = re.search(r"= ([\d.]+)", comparison)
    assert found, comparison
    return float(found[1])


def state(contender: str) -> float:
    """Return a state's Redis time per check over a fresh filter's, from measure (g)."""
    measure = "g 1M @ 1e-4 usec/check"
    kind = contender.rsplit(": ", 1)[1]
    return over(measure, contender, f"bitmap, fresh: {kind}", "states-results.json")


def bf_add(contender: str) -> float:
    """Return a state's Redis time per check over BF.ADD's on a scaling filter at 3x (g)."""
    kind = contender.rsplit(": ", 1)[1]
    peer = f"RedisBloom BF.ADD, scaling, 3x: {kind}"
    return over("g 1M @ 1e-4 usec/check", contender, peer, "states-results.json")


def sized_gib(capacity: int, rate: float) -> float:
    spec = BloomConfig.from_settings(
        {"BLOOMFILTER_CAPACITY": capacity, "BLOOMFILTER_ERROR_RATE": rate}
    ).spec
    return spec.total_bytes / 2**30


SET = "scrapy-redis 0.9 (SET)"
SET_BYTES = ("c", "scrapy-redis SET (pipelined SADD)")
MADD = "s {} @ 1e-4, calls of 1,000,000"


def figures() -> dict[str, list[tuple[str, list[float | tuple[float, float]]]]]:
    """Return, per page, each phrase stating figures ({} for each) and the run's values.

    A value is a float, or (low, high) for a range the page gives as ``low-high``.
    """
    cache_off = over("b", "ours, BLOOMFILTER_CACHE_SIZE=0", SET)
    repeats = over("b", "ours", SET)
    sadd = over("t usec/check", "ours", SET)
    sadd_1m = over("t usec/check", "ours, 1M @ 1e-4", SET)
    native = over("t usec/check", "ours, BLOOMFILTER_BACKEND=native", SET)
    native_1m = over("t usec/check", "ours, native, 1M @ 1e-4", SET)
    page = "e filter usec/page"
    window_native = over(page, "ours, native, batched, 50 ms window", SET)
    madd_1m = per_round(MADD.format("1M"), "ours, defaults (bitmap, numpy)")
    madd_100m = per_round(MADD.format("100M"), "ours, defaults (bitmap, numpy)")
    plain = "ours, default install (no numpy, no hiredis)"
    no_numpy = sorted(per_round(MADD.format(size), plain) for size in ("1M", "100M"))
    numpy_gain = sorted(
        over(MADD.format(size), "ours, defaults (bitmap, numpy)", plain) for size in ("1M", "100M")
    )
    set_bytes = median(*SET_BYTES)
    memory = [
        ("takes {} bytes", [set_bytes]),
        ("billion URLs fit in {} GiB instead of ~{} GiB", [
            sized_gib(10**9, 1e-4), set_bytes * 10**9 / 2**30]),
    ]  # fmt: skip
    windowed = ("bitmap, TTL=3600, fresh window", "bitmap, TTL=3600, 0.9x in the window",
                "bitmap, TTL, next window (0.9x before, 0.45x now)")  # fmt: skip
    windows = [state(f"{name}: new") for name in windowed]
    windows_seen = [state(f"{name}: seen") for name in windowed]
    readme = [
        ("About {} bytes per URL at a 1-in-10,000 error rate", [
            sized_gib(10**9, 1e-4) * 2**30 / 10**9]),
        *memory,
        ("for bulk loads {}x faster", [(numpy_gain[0], numpy_gain[1])]),
        ("({}x its `request_seen` calls per second), **{}x on a crawl's repeats**", [
            over("a", "ours", SET), repeats]),
        ("(the default; {}x with `BLOOMFILTER_CACHE_SIZE = 0`)", [cache_off]),
        ("{}x a `SADD` at the default sizing and {}x at 1M URLs @ 1e-4 ({}x and {}x with the"
         " native backend", [sadd, sadd_1m, native, native_1m]),
        ("on a 100M-URL filter {}x a `SADD` and {}x RedisBloom's `BF.ADD`", [
            over("t usec/check", "ours, 100M @ 1e-4, blocked", SET),
            over("t usec/check", "ours, 100M @ 1e-4, blocked", "RedisBloom BF.ADD, 100M @ 1e-4")]),
        ("{}x scrapy-redis's without batching", [over(page, "ours", SET)]),
        ("{}x with `BatchingMiddleware`", [over(page, "ours, batched", SET)]),
        ("{}x with its 50 ms window", [over(page, "ours, batched, 50 ms window", SET)]),
        ("{}x with the window on the native backend", [window_native]),
        ("with numpy: {}x RedisBloom's `BF.MADD` at 1M URLs and {}x at 100M; without numpy {}x",
         [madd_1m, madd_100m, (no_numpy[0], no_numpy[1])]),
        ("That new URL is {}x RedisBloom's `BF.ADD` on a scaling filter grown as far, about the"
         " least stock Redis commands allow", [bf_add("bitmap, grown to 3x: new")]),
        ("the native backend grows in C at {}x", [bf_add("native, grown to 3x: new")]),
        ("grown to 3x, a new URL costs {}x a fresh filter's check of Redis time and a seen one"
         " {}x; with windows {}x and {}x", [
             state("bitmap, grown to 3x: new"), state("bitmap, grown to 3x: seen"),
             (min(windows), max(windows)), (min(windows_seen), max(windows_seen))]),
    ]  # fmt: skip
    index = [
        *memory,
        ("URLs, {}x on a crawl's repeats** (the near-cache's; {}x without it)", [
            repeats, cache_off]),
        ("at {}x a `SADD` of Redis time per check ({}x with the native backend", [
            (sadd, sadd_1m), (native_1m, native)]),
        ("({}x scrapy-redis's Redis time per page on the native backend)", [window_native]),
        ("Bulk loads with numpy in calls of 1,000,000 at {}x RedisBloom's `BF.MADD`", [
            (madd_1m, madd_100m)]),
    ]  # fmt: skip
    return {"README.md": readme, "docs/index.md": index}


def flat(markdown: str) -> str:
    """Return a page's prose, fenced blocks left out, its lines joined by single spaces."""
    prose_lines = []
    fence = False
    for line in markdown.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
            continue
        if not fence:
            prose_lines.append(line)
    # Multiplication signs and en dashes read as x and -, as this module writes them.
    text = "\n".join(prose_lines).replace("\u00d7", "x").replace("\u2013", "-")
    return re.sub(r"\s+", " ", text)


def rounds_to(said: str, value: float) -> bool:
    """Tell whether ``value`` written with as many decimals as ``said`` has is ``said``."""
    decimals = len(said.partition(".")[2])
    return abs(float(said.replace(",", "")) - value) <= 0.5 * 10**-decimals + 1e-9


def said_wrong(said: str, value: float | tuple[float, float]) -> bool:
    low, _, high = said.partition("-")
    if isinstance(value, tuple):
        if not high:  # one figure for two values: both must round to it
            return not (rounds_to(low, value[0]) and rounds_to(low, value[1]))
        return not (rounds_to(low, value[0]) and rounds_to(high, value[1]))
    return bool(high) or not rounds_to(low, value)


def figure_problems(page: str, text: str) -> list[str]:
    """Return what is wrong with the benchmark's figures ``text`` (page ``page``) states."""
    wrong = []
    covered: list[tuple[int, int]] = []
    for phrase, values in figures()[page]:
        pattern = NUMBER.join(re.escape(part) for part in phrase.split("{}"))
        match = re.search(pattern, text)
        if match is None:
            wrong.append(f"{page}: no {phrase!r} (a figure of the committed run)")
            continue
        covered.append(match.span())
        for said, value in zip(match.groups(), values, strict=True):
            if said_wrong(said, value):
                shown = (
                    f"{value[0]:.3g}-{value[1]:.3g}" if isinstance(value, tuple) else f"{value:.3g}"
                )
                wrong.append(f"{page}: {match[0]!r}: {said}, where the committed run has {shown}")
    for ratio in RATIO.finditer(text):
        if not any(start <= ratio.start() < end for start, end in covered):
            context = text[max(0, ratio.start() - 60) : ratio.end() + 20]
            wrong.append(f"{page}: {ratio[0]!r} is no figure of the committed run: ...{context}...")
    return wrong


def run_named(name: str) -> str:
    return f"{str(bench_run(name)['date'])[:16]} UTC"


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_benchmark_figures_are_the_committed_runs(page: str) -> None:
    """Each figure the page states is the committed run's, within the page's rounding.

    The runs are bench/results.json (and bench/states-results.json for the filter's states,
    measure (g)); every ratio (``2.0x``) in the page's prose must be one of :func:`figures`,
    and the page names the run its figures come from.
    """
    text = flat((ROOT / page).read_text(encoding="utf-8"))
    wrong = figure_problems(page, text)
    assert f"run of {run_named('results.json')}" in text, f"{page} does not name the run"
    if page == "README.md":
        assert f"run of {run_named('states-results.json')}" in text
    for name in ("results", "states-results"):  # the tables beside the JSON are the same run
        date = bench_run(f"{name}.json")["date"]
        assert f"- date: {date}" in (BENCH / f"{name}.md").read_text(encoding="utf-8"), name
    assert not wrong, "\n".join(wrong)


def test_a_stale_figure_fails() -> None:
    """The check above finds a figure that is not the run's, and a ratio it does not know."""
    text = flat((ROOT / "README.md").read_text(encoding="utf-8"))
    assert not figure_problems("README.md", text)
    stale = text.replace("**6.3x on a crawl's repeats**", "**5.5x on a crawl's repeats**")
    assert stale != text
    problems = figure_problems("README.md", stale)
    assert any(": 5.5, where the committed run has 6.32" in line for line in problems), problems
    unknown = text + " It is 9.9x faster at everything."
    assert any("9.9x" in line for line in figure_problems("README.md", unknown))


# -- the capacity page's table ----------------------------------------------------------------

CHOOSE = DOCS / "howto" / "choose-capacity.md"
#: The capacity the page's table is computed for.
TABLE_CAPACITY = 100_000_000


def capacity_row(rate: float) -> tuple[str, float]:
    """Return the page's row for ``rate``, and the memory a fixed-size filter saves."""
    sized = {"BLOOMFILTER_CAPACITY": TABLE_CAPACITY, "BLOOMFILTER_ERROR_RATE": rate}
    grows = BloomConfig.from_settings(sized)
    fixed = BloomConfig.from_settings({**sized, "BLOOMFILTER_EXPANSION": 0})
    cells = [f"{rate:g}"]
    for config in (grows, fixed):
        spec = config.spec
        cells += [
            str(spec.hash_count),
            format_bytes(spec.total_bytes),
            f"{spec.total_bytes / TABLE_CAPACITY:.2f}",
        ]
    cells.append(f"{grows.growth.grown_capacity / TABLE_CAPACITY:,.0f}x")
    return "| " + " | ".join(cells) + " |", 1 - fixed.spec.total_bytes / grows.spec.total_bytes


def test_the_capacity_pages_table() -> None:
    """Every row of choose-capacity.md's table is the package's sizing, and so is the prose."""
    text = CHOOSE.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if re.match(r"^\| [\d.e-]+ \|", line)]
    assert len(rows) == 5, rows
    rates = [float(row.split("|")[1]) for row in rows]
    computed = [capacity_row(rate) for rate in rates]
    assert rows == [row for row, _ in computed]
    prose = flat(text)
    # "6-14% less memory": what the fixed-size filters of the table save.
    saved = [share for _, share in computed]
    said = re.search(r"never grows: (\d+)-(\d+)% less memory", prose)
    assert said, "the fixed-size filter's saving is not stated"
    assert (int(said[1]), int(said[2])) == (
        math.floor(100 * min(saved)),
        math.floor(100 * max(saved)),
    ), saved
    # "0.7 to 1.3 bytes per URL more" for each tenfold lower rate.
    per_url = [float(row.split("|")[4]) for row in rows]
    steps = [b - a for a, b in itertools.pairwise(per_url)]
    said = re.search(r"tenfold lower rate costs ([\d.]+) to ([\d.]+) bytes per URL more", prose)
    assert said, "the cost of a lower rate is not stated"
    assert rounds_to(said[1], min(steps)), steps
    assert rounds_to(said[2], max(steps)), steps


# -- the sizing page's tables -------------------------------------------------------------------

SIZE_PAGE = DOCS / "howto" / "size-a-filter.md"
#: scrapy-redis's SET, bytes per fingerprint, as the page states it (the benchmark's).
TABLE_SET_BYTES = 80.4


def sizing_row(capacity: int, rate: float) -> str:
    """Return the sizing table's row for a capacity and rate: this release's geometry."""
    sized = {"BLOOMFILTER_CAPACITY": capacity, "BLOOMFILTER_ERROR_RATE": rate}
    grows = BloomConfig.from_settings(sized)
    fixed = BloomConfig.from_settings({**sized, "BLOOMFILTER_EXPANSION": 0})
    spec = grows.spec
    cells = [
        f"{capacity:,}",
        f"{rate:g}",
        str(spec.hash_count),
        f"{spec.shards:,}",
        format_bytes(spec.total_bytes),
        f"{spec.total_bytes / capacity:.2f}",
        f"{format_bytes(fixed.spec.total_bytes)} ({fixed.spec.hash_count})",
        f"{grows.growth.grown_capacity / capacity:,.0f}x",
        format_bytes(int(capacity * TABLE_SET_BYTES)),
    ]
    return "| " + " | ".join(cells) + " |"


def layouts_row(rate: float, capacity: int = 100_000_000) -> str:
    """Return the layouts table's row for a rate: each layout's k and memory, growing and fixed."""
    cells = [f"{rate:g}"]
    for growing in (True, False):
        sized = {"BLOOMFILTER_CAPACITY": capacity, "BLOOMFILTER_ERROR_RATE": rate}
        config = BloomConfig.from_settings(
            sized if growing else {**sized, "BLOOMFILTER_EXPANSION": 0}
        )
        costs = {cost.layout: cost for cost in layout_costs(config.sizing, capacity)}
        shown = ("classic", "blocked", "native") if growing else ("classic", "blocked")
        extra = costs["blocked"].memory_bytes / costs["classic"].memory_bytes - 1
        for layout in shown:
            cost = costs[layout]
            cells.append(f"{cost.hash_count}, {format_bytes(cost.memory_bytes)}")
            if layout == "blocked":
                cells.append(f"+{100 * extra:.1f}%")
    return "| " + " | ".join(cells) + " |"


def test_the_sizing_pages_tables() -> None:
    """Every row of size-a-filter.md's two tables is this release's sizing."""
    lines = SIZE_PAGE.read_text(encoding="utf-8").splitlines()
    sizing = [line for line in lines if re.match(r"^\| [\d,]+ \| [\d.e-]+ \|", line)]
    assert len(sizing) >= 10, sizing
    for line in sizing:
        capacity, rate = line.split("|")[1:3]
        assert line == sizing_row(int(capacity.replace(",", "")), float(rate))
    start = next(i for i, line in enumerate(lines) if line.startswith("| error rate | growing"))
    layouts = list(itertools.takewhile(lambda line: line.startswith("| "), lines[start + 2 :]))
    assert len(layouts) == 3, layouts
    for line in layouts:
        assert line == layouts_row(float(line.split("|")[1]))


def test_the_capacity_pages_benchmark_figures() -> None:
    """The costs of growth the page gives are the committed runs' figures."""
    prose = flat(CHOOSE.read_text(encoding="utf-8"))
    said = re.search(
        r"just past capacity, a new URL costs ([\d.]+)x a fresh filter's check and a seen one"
        r" ([\d.]+)x; grown to 3x, ([\d.]+)x and ([\d.]+)x",
        prose,
    )
    assert said, "the page's Redis time per check past capacity is gone"
    past = "bitmap, just past capacity (1.05x)"
    values = [state(f"{past}: new"), state(f"{past}: seen")]
    values += [state("bitmap, grown to 3x: new"), state("bitmap, grown to 3x: seen")]
    wrong = [(s, v) for s, v in zip(said.groups(), values, strict=True) if not rounds_to(s, v)]
    assert not wrong, wrong
    assert f"run of {run_named('states-results.json')}" in prose
    # The memory of growth: bench/growth.md's measure.
    growth = (BENCH / "growth.md").read_text(encoding="utf-8")
    said = re.search(r"took ([\d.]+) times the memory of one sized for that", prose)
    assert said
    assert f"Grown / right-sized fixed: **{said[1]}x** the memory." in growth
    assert "run of 2026-11-23" in prose
    assert "- Date: 2026-11-23" in growth
    assert f"takes {median(*SET_BYTES):.1f} bytes per URL" in prose


def test_the_runs_lengths() -> None:
    """How long the benchmark runs, where the pages say it: the committed runs' own time."""
    said = {
        BENCH / "README.md": ["results.json", "states-results.json", "states-results-10m.json"],
        DOCS / "explanation" / "bench-results.md": ["results.json"],
    }
    for page, runs in said.items():
        text = flat(page.read_text(encoding="utf-8"))
        for name in runs:
            seconds = round(float(bench_run(name)["elapsed"]))  # type: ignore[arg-type]
            assert f"{seconds} s" in text, f"{page.relative_to(ROOT)}: no {seconds} s ({name})"
        assert "fifteen minutes" not in text
        assert "six to twelve minutes" not in text


def test_the_bulk_over_a_network_figures_are_the_runs() -> None:
    """The benchmark page's table of bulk loads over a network, and the migrate page's rates.

    The table is ``bench/bulk_compare.py``'s, printed from bench/bulk-results*.json; the
    migrate page's rates in calls of 1,000,000 are those runs' medians.
    """
    sys.path.insert(0, str(BENCH))
    try:
        from bulk_compare import table
    finally:
        sys.path.remove(str(BENCH))
    page = (DOCS / "explanation" / "bench-results.md").read_text(encoding="utf-8")
    assert table() in page, "docs/explanation/bench-results.md's table is not bulk_compare's"
    for name in ("bulk-results", "bulk-results-8647704"):
        date = bench_run(f"{name}.json")["date"]
        assert f"- date: {date}" in (BENCH / f"{name}.md").read_text(encoding="utf-8"), name
    cells = bench_run("bulk-results.json")["measures"]["s"]  # type: ignore[index]
    migrate = flat((DOCS / "howto" / "migrate.md").read_text(encoding="utf-8"))
    for size in ("1M", "100M", "1000M"):
        for through in ("", ", 1 Gbit/s link"):
            rates = cells[f"{size} @ 1e-4, calls of 1,000,000{through}"]["fp_per_s"]
            for contender in ("ours, defaults (bitmap, numpy)", "RedisBloom BF.MADD"):
                said = f"{round(rates[contender]['median']):,}"
                assert said in migrate, f"migrate.md lacks {said} fp/s ({size}{through})"


def test_the_operations_pages_rates_are_what_the_code_prints() -> None:
    """The sample sessions' false-positive rates follow the rate the code computes now.

    (They had drifted by ten orders of magnitude when the blocked rate gained its seed floor.)
    """
    text = (DOCS / "howto" / "scrapy-bloom.md").read_text(encoding="utf-8")
    info = text.split("$ scrapy bloom info --spider myspider\n", 1)[1].split("```", 1)[0]
    field = {line[:30].strip(): line[30:].strip() for line in info.splitlines() if len(line) > 30}
    bits = int(field["Bits (m)"].split()[0].replace(",", ""))
    k = int(field["Hash functions (k)"])
    block = 512 if "blocked" in field["Layout / hash scheme"] else 0

    def rate(items: int) -> str:
        return f"{false_positive_rate(bits, k, items, block):.3g}"

    items = int(field["Estimated items"].replace(",", ""))
    assert field["Estimated FP rate now"] == rate(items)
    watched = re.findall(r"  ([\d,]+) items \(.*?FP rate (\S+)  ", text)
    assert len(watched) == 3
    for count, said in watched:
        assert said == rate(int(count.replace(",", ""))), count

"""The code blocks of README.md and the docs' pages, read from them, for :mod:`test_readme`.

:func:`parse_blocks` finds every fenced code block of a page (also one indented inside a
list item; MyST directives such as ```` ```{toctree} ```` are not code) and names it by its
section heading and its place in that section (``Sentinel#1``); :func:`all_blocks` reads
README.md and every page of :func:`pages` (the tutorial has its own test,
test_tutorial.py). :func:`commands` joins a shell block's continued lines into
commands, :func:`exec_settings` runs a ``settings.py`` block into a dict, and
:class:`Hosts` puts the test's servers and files where a block names hosts such as
``redis://localhost:6379`` or certificate paths, refusing any it has no stand-in for.
:func:`shell_problems` checks install-style commands (``pip install -e . --group test``,
``python bench/run.py --quick``, ``pytest``) against the repository without running
them: the extras, dependency groups, scripts, flags and entry points they name must exist.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scrapy_redis_bloom.cli import build_parser
from scrapy_redis_bloom.core.settings import BloomConfig

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: Pages of docs/ whose blocks are not checked here: the tutorial (test_tutorial.py runs
#: it), and the design notes, which hold diagrams rather than code.
NOT_HERE = ("tutorial.md", "architecture.md", "design/", "_build/", "reference/generated/")

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_HEADING = re.compile(r"^#{1,6} +(?P<title>.+?) *#*$")


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced code block of the README."""

    section: str
    #: 1-based place among the blocks of its section.
    index: int
    #: The fence's language (``bash``, ``python``), ``""`` when it has none.
    lang: str
    #: The content, without the fence lines and without the fence's indentation.
    text: str
    #: 1-based line of the opening fence in its page.
    line: int
    #: The page, relative to the repository: ``README.md``, ``docs/howto/tls-acl.md``.
    source: str = "README.md"

    @property
    def id(self) -> str:
        """The block's name in failures and in the test's table: ``section#index``."""
        return f"{self.section}#{self.index}"

    def where(self) -> str:
        """Name the block for a failure message."""
        return f"block {self.id!r} (```{self.lang} at {self.source} line {self.line})"


def pages() -> list[Path]:
    """Return README.md and the docs' pages whose blocks test_readme.py checks."""
    found = [
        path
        for path in sorted(DOCS.rglob("*.md"))
        if not any(path.relative_to(DOCS).as_posix().startswith(p) for p in NOT_HERE)
    ]
    return [README, *found]


def all_blocks() -> list[Block]:
    """Return the blocks of every page of :func:`pages`, each named by its page too."""
    return [
        block
        for path in pages()
        for block in parse_blocks(
            path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix()
        )
    ]


def docs_text() -> str:
    """Return README.md and the docs' pages, one after the other."""
    return "\n".join(path.read_text(encoding="utf-8") for path in pages())


def page_text(relative: str) -> str:
    """Return one page of the repository (``docs/howto/size-a-filter.md``)."""
    return (ROOT / relative).read_text(encoding="utf-8")


def parse_blocks(markdown: str, source: str = "README.md") -> list[Block]:
    """Return every fenced code block of ``markdown``, in order.

    A block is named by the closest heading above it (``#`` to ``######``; headings
    inside blocks do not count) and numbered within that section. A fence may be
    indented (a block inside a list item); its indentation is removed from the lines.
    An unclosed fence is an error, not a block that runs to the end. A MyST directive
    (a fence whose info starts with ``{``) is not a code block.
    """
    blocks: list[Block] = []
    section = "(before any heading)"
    counts: dict[str, int] = {}
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            heading = _HEADING.match(lines[i])
            if heading is not None:
                section = heading["title"].strip()
            i += 1
            continue
        indent = len(opening["indent"])
        fence = opening["fence"]
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines):
            stripped = lines[i].strip()
            if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
                break
            line = lines[i]
            body.append(line[indent:] if line[:indent].strip() == "" else line.lstrip())
            i += 1
        else:
            raise ValueError(f"{source} line {start + 1}: the code fence is never closed")
        info = opening["info"].strip()
        if info.startswith("{"):
            i += 1
            continue
        counts[section] = counts.get(section, 0) + 1
        blocks.append(
            Block(
                section=section,
                index=counts[section],
                lang=info.split()[0] if info else "",
                text="\n".join(body) + "\n",
                line=start + 1,
                source=source,
            )
        )
        i += 1
    return blocks


def readme_text() -> str:
    return README.read_text(encoding="utf-8")


def prose(markdown: str) -> str:
    """Return ``markdown`` with its fenced blocks blanked out (line numbers kept)."""
    out: list[str] = []
    fence: str | None = None
    for line in markdown.splitlines():
        match = _FENCE.match(line)
        if fence is None and match is not None:
            fence = match["fence"]
            out.append("")
        elif fence is not None:
            stripped = line.strip()
            if stripped.startswith(fence) and not stripped.strip(fence[0]):
                fence = None
            out.append("")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def inline_code(markdown: str) -> Iterator[tuple[int, str]]:
    """Yield ``(line, text)`` of each one-line inline code span outside the blocks."""
    for number, line in enumerate(prose(markdown).splitlines(), start=1):
        for match in re.finditer(r"`([^`]+)`", line):
            yield number, match.group(1)


def commands(text: str) -> list[str]:
    """Return a shell block's commands: continued lines joined, blanks and comments dropped."""
    joined: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        line = (pending + line.strip()).strip()
        pending = ""
        if line and not line.startswith("#"):
            joined.append(line)
    if pending.strip():
        joined.append(pending.strip())
    return joined


def exec_settings(block: Block) -> dict[str, Any]:
    """Run a ``settings.py`` block as Scrapy would import it; return its UPPERCASE names.

    Only plain assignments are allowed (no imports or calls), so what the README shows
    is data a reader can copy as is.
    """
    tree = ast.parse(block.text, filename=block.id)
    for node in tree.body:
        if not isinstance(node, ast.Assign | ast.AnnAssign):
            raise AssertionError(f"{block.where()}: not a plain assignment: {ast.unparse(node)}")
    namespace: dict[str, Any] = {}
    exec(compile(tree, block.id, "exec"), {"__builtins__": {}}, namespace)
    return {name: value for name, value in namespace.items() if name.isupper()}


# -- stand-ins for the hosts and files the README names ---------------------------------------


def _looks_external(text: str) -> bool:
    """Tell whether a value names a host or a file of the reader's machine."""
    return "://" in text or text.startswith("/")


class Hosts:
    """The test's stand-ins for the hosts and files a README block names.

    ``mapping`` takes a literal of the README (``redis://localhost:6379``,
    ``/etc/ssl/redis/ca.crt``) to the test's (a server's URL, a file made for the
    test). A URL or absolute path without a stand-in fails the test, naming it and the
    block: a new host in the README needs a server here, not a silent connection to a
    machine that does not exist.
    """

    def __init__(self, block: Block, mapping: Mapping[str, str]) -> None:
        self.block = block
        self.mapping = dict(mapping)

    def text(self, value: str) -> str:
        if value in self.mapping:
            return self.mapping[value]
        if _looks_external(value):
            raise AssertionError(
                f"{self.block.where()} names {value!r}, which this test has no server or file"
                f" for; it knows {sorted(self.mapping)}. Add a stand-in to tests/test_readme.py."
            )
        return value

    def argv(self, argv: list[str]) -> list[str]:
        return [self.text(arg) for arg in argv]

    def value(self, value: Any) -> Any:
        """Replace in a settings value, recursively through lists, tuples and dicts."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(item) for item in value]
        if isinstance(value, tuple):
            return tuple(self.value(item) for item in value)
        if isinstance(value, dict):
            return {key: self.value(item) for key, item in value.items()}
        return value

    def settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        return {name: self.value(value) for name, value in settings.items()}


# -- install-style commands, checked against the repository -----------------------------------


@functools.cache
def pyproject() -> dict[str, Any]:
    """Return pyproject.toml, parsed."""
    parsed: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return parsed


def extras() -> set[str]:
    return set(pyproject()["project"].get("optional-dependencies", {}))


def groups() -> set[str]:
    """Return the dependency groups (PEP 735) that ``pip install --group NAME`` installs."""
    return set(pyproject().get("dependency-groups", {}))


@functools.cache
def script_help(script: str) -> str:
    """Return ``python <script> --help`` (run from the repository root, 60 s at most)."""
    done = subprocess.run(
        [sys.executable, script, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"python {script} --help exited {done.returncode}: {done.stderr}")
    return done.stdout


def _uses_argparse(path: Path) -> bool:
    return "argparse" in path.read_text(encoding="utf-8")


def _flags(args: list[str]) -> list[str]:
    return [arg.split("=", 1)[0] for arg in args if arg.startswith("-")]


@dataclass
class ShellState:
    """What earlier commands of one block made: the virtualenvs, by directory."""

    venvs: set[str]


def shell_problems(command: str, state: ShellState | None = None) -> list[str]:
    """Check an install-style command against the repository; return what is wrong.

    ``command`` may chain simple commands with ``&&``. Each must match a rule below;
    one that matches none is a problem too ("no rule"), so that a new kind of command in
    the README gets a check rather than a pass.
    """
    state = state if state is not None else ShellState(venvs=set())
    problems: list[str] = []
    for part in command.split("&&"):
        argv = shlex.split(part)
        if not argv:
            problems.append(f"empty command in {command!r}")
            continue
        problems += [f"{part.strip()!r}: {p}" for p in _simple(argv, state)]
    return problems


def _venv_prefix(program: str, state: ShellState) -> tuple[str, list[str]]:
    """Split ``.venv/bin/pip`` into ``pip`` and a problem if ``.venv`` was never made."""
    if "/bin/" not in program:
        return program, []
    venv, name = program.rsplit("/bin/", 1)
    if venv not in state.venvs:
        return name, [f"{program} runs from a virtualenv {venv!r} no earlier command made"]
    return name, []


def _simple(argv: list[str], state: ShellState) -> list[str]:
    program, problems = _venv_prefix(argv[0], state)
    args = argv[1:]
    if program == "python3" and args[:2] == ["-m", "venv"] and len(args) == 3:
        state.venvs.add(args[2].rstrip("/"))
        return problems
    if program in (".", "source") and len(args) == 1:
        venv = args[0].removesuffix("/bin/activate")
        if venv == args[0] or venv not in state.venvs:
            problems.append(f"activates {args[0]!r}, not a virtualenv an earlier command made")
        return problems
    if program == "pip" and args[:1] == ["install"]:
        return problems + _pip_install(args[1:])
    if program in ("python", "python3"):
        return problems + _python(args)
    if program == "pytest":
        if "pytest" not in pyproject().get("tool", {}):
            problems.append("pyproject.toml has no [tool.pytest.ini_options]")
        for path in pyproject()["tool"]["pytest"]["ini_options"].get("testpaths", []):
            if not (ROOT / path).is_dir():
                problems.append(f"pytest's testpaths names {path!r}, which is not a directory")
        return problems
    if program == "scrapy-redis-bloom":
        return problems + _cli(args)
    if program == "sphinx-build":
        return problems + _sphinx_build(args)
    if program == "scrapy" and args[:1] == ["crawl"]:
        return problems + _scrapy_crawl(args[1:])
    if program == "scrapy" and args[:1] == ["bloom"]:
        return problems + _scrapy_bloom(args[1:])
    return [*problems, f"no rule checks {program!r} commands (add one to tests/readme_blocks.py)"]


_EDITABLE = re.compile(r"^\.(?:\[(?P<extras>[^\]]*)\])?$")
_REQUIREMENT = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)(?:\[(?P<extras>[^\]]*)\])?$")


def _check_extras(listed: str | None) -> list[str]:
    known = extras()
    named = [e.strip() for e in (listed or "").split(",") if e.strip()]
    return [
        f"names the extra {e!r}, which pyproject.toml's [project.optional-dependencies]"
        f" does not define (it has {sorted(known)})"
        for e in named
        if e not in known
    ]


def _check_groups(args: list[str]) -> tuple[list[str], list[str]]:
    """Take ``--group NAME`` options out of ``args``; return the rest and the problems."""
    rest: list[str] = []
    problems: list[str] = []
    known = groups()
    options = iter(args)
    for arg in options:
        if arg != "--group":
            rest.append(arg)
            continue
        name = next(options, "")
        if name not in known:
            problems.append(
                f"names the dependency group {name!r}, which pyproject.toml's"
                f" [dependency-groups] does not define (it has {sorted(known)})"
            )
    return rest, problems


def _pip_install(args: list[str]) -> list[str]:
    if args == ["--upgrade", "pip"]:  # pip >= 25.1 reads dependency groups (--group)
        return []
    args, problems = _check_groups(args)
    if problems or not args:  # pip install --group NAME: the group alone
        return problems
    if args[:1] == ["-e"] and len(args) == 2:
        editable = _EDITABLE.match(args[1])
        if editable is None:
            return [f"installs {args[1]!r} in editable mode, not this repository ('.')"]
        return _check_extras(editable["extras"])
    if args[:1] == ["--upgrade"] and len(args) == 2:  # pip install --upgrade scrapy-redis-bloom
        args = args[1:]
    if len(args) == 1:
        requirement = _REQUIREMENT.match(args[0])
        name = pyproject()["project"]["name"]
        if requirement is None or requirement["name"] != name:
            return [f"installs {args[0]!r}, which is not this project ({name!r})"]
        return _check_extras(requirement["extras"])
    return [f"no rule checks pip install {' '.join(args)}"]


def _python(args: list[str]) -> list[str]:
    if args[:1] == ["-m"]:
        module = args[1] if len(args) > 1 else ""
        if importlib.util.find_spec(module) is None:
            return [f"module {module!r} is not importable"]
        if importlib.util.find_spec(f"{module}.__main__") is None:
            return [f"module {module!r} has no __main__ to run"]
        if module == "scrapy_redis_bloom":
            return _cli(args[2:])
        return [f"no rule checks python -m {module}"]
    if not args or not args[0].endswith(".py"):
        return [f"no rule checks python {' '.join(args)}"]
    script, flags = args[0], _flags(args[1:])
    path = ROOT / script
    if not path.is_file():
        return [f"{script} does not exist in the repository"]
    if "__main__" not in path.read_text(encoding="utf-8"):
        return [f"{script} has no `if __name__ == '__main__'` entry point"]
    if not _uses_argparse(path):
        return [f"{script} takes no options, yet is given {flags}"] if flags else []
    shown = script_help(script)
    return [f"{script} --help does not list {flag}" for flag in flags if flag not in shown]


def _cli(args: list[str]) -> list[str]:
    scripts = pyproject()["project"].get("scripts", {})
    if scripts.get("scrapy-redis-bloom") != "scrapy_redis_bloom.cli:main":
        return ["pyproject.toml's [project.scripts] has no scrapy-redis-bloom = cli:main"]
    parser = build_parser()
    if not args:
        return []
    if args == ["--help"]:
        return [] if parser.format_help() else ["--help prints nothing"]
    return _subcommand("scrapy-redis-bloom", parser, args)


def _subcommand(program: str, parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """Check that ``args[0]`` is a subcommand of ``parser`` and has the options given."""
    choices: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:  # argparse keeps its subcommands private
        if isinstance(action, argparse._SubParsersAction):
            choices.update(action.choices)
    if args[0] not in choices:
        return [f"{program} has no command {args[0]!r} (it has {sorted(choices)})"]
    sub = choices[args[0]]
    known = {opt for action in sub._actions for opt in action.option_strings}
    return [f"{args[0]} has no option {flag}" for flag in _flags(args[1:]) if flag not in known]


def _scrapy_bloom(args: list[str]) -> list[str]:
    """``scrapy bloom [COMMAND] [options]``: the entry point, command and options must exist."""
    from scrapy.settings import Settings

    from scrapy_redis_bloom.cli import BloomCommand

    group = pyproject()["project"].get("entry-points", {}).get("scrapy.commands", {})
    if group.get("bloom") != "scrapy_redis_bloom.cli:BloomCommand":
        return ["pyproject.toml registers no scrapy.commands entry point bloom = BloomCommand"]
    command = BloomCommand()
    command.settings = Settings()
    parser = argparse.ArgumentParser()
    command.add_options(parser)
    if not args or args == ["--help"]:
        return []
    return _subcommand("scrapy bloom", parser, args)


def _sphinx_build(args: list[str]) -> list[str]:
    """``sphinx-build [options] SOURCE OUTPUT``: the docs' sources and configuration exist."""
    if len(args) < 2:
        return ["sphinx-build needs a source and an output directory"]
    source = ROOT / args[-2]
    if not (source / "conf.py").is_file():
        return [f"sphinx-build's source {args[-2]!r} has no conf.py"]
    if "docs" not in groups():
        return ["pyproject.toml has no docs dependency group to install Sphinx from"]
    return []


def _scrapy_crawl(args: list[str]) -> list[str]:
    """``scrapy crawl [SPIDER] [-s NAME=VALUE]...``: the settings given must be valid."""
    settings: dict[str, str] = {}
    rest = iter(args)
    for arg in rest:
        if arg == "-s":
            name, _, value = next(rest, "").partition("=")
            settings[name] = value
    if not settings:
        return []
    try:
        BloomConfig.from_settings(settings)
    except ValueError as exc:
        return [f"the settings {settings} are refused: {exc}"]
    return []

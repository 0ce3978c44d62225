"""The reference pages generated from the code: settings, stats and ``scrapy bloom`` commands.

Each page is built from the one table the code itself reads, so it cannot drift:

* settings: :data:`scrapy_redis_bloom.core.settings.SETTINGS`, through
  :func:`~scrapy_redis_bloom.core.settings.reference` (the table the code validates with);
* stats: :data:`scrapy_redis_bloom.scrapy.stats.STATS` (every stat the filter emits);
* commands: the argparse parsers both front ends build from
  :data:`scrapy_redis_bloom.cli.options.COMMANDS` and ``OPTIONS``.

:func:`problems` says which setting, stat, command or option has no entry, or an entry
without its meaning, in a page's text: the Sphinx build fails on it (``setup``) and so
does ``tests/test_docs_reference.py``. Nothing here imports Sphinx but :func:`setup`,
so the tests build the pages in-process without it.
"""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: Where the pages are written at build time (gitignored), included by reference/*.md.
GENERATED = Path(__file__).resolve().parent.parent / "reference" / "generated"

#: The two front ends: how each is called, in the page's headings.
FRONTS = {"scrapy": "scrapy bloom", "alias": "scrapy-redis-bloom"}


def _cell(text: str) -> str:
    """Make ``text`` safe for one cell of a Markdown table."""
    return " ".join(text.split()).replace("|", "\\|")


# -- settings ---------------------------------------------------------------------------------


def settings_page() -> str:
    """Return the settings table: one row per row of ``SETTINGS``, as the code checks them."""
    from scrapy_redis_bloom.core.settings import reference

    return reference()


def settings_problems(text: str) -> list[str]:
    """Name each setting without a row, or whose row has no meaning, in ``text``."""
    from scrapy_redis_bloom.core.settings import SETTINGS

    return _missing_rows(text, [row.name for row in SETTINGS], "setting", "settings")


def _missing_rows(text: str, names: list[str], kind: str, page: str) -> list[str]:
    """Name each of ``names`` without a row (first cell its name) or a meaning in ``text``."""
    rows = _table_rows(text)
    found = []
    for name in names:
        cells = rows.get(f"`{name}`")
        if cells is None:
            found.append(f"the {kind} {name} has no row in the {page} reference")
        elif not cells[-1].strip():
            found.append(f"the {kind} {name} has no meaning in the {page} reference")
    return found


# -- stats ------------------------------------------------------------------------------------


def stats_page() -> str:
    """Return the stats table: every stat of ``STATS``, with its meaning."""
    from scrapy_redis_bloom.scrapy.stats import PREFIX, STATS

    head = "| stat | meaning |\n|---|---|\n"
    return head + "".join(
        f"| `{PREFIX}{name}` | {_cell(meaning)} |\n" for name, meaning in STATS.items()
    )


def stats_problems(text: str) -> list[str]:
    """Name each stat of ``STATS`` without a row, or whose row has no meaning, in ``text``."""
    from scrapy_redis_bloom.scrapy.stats import PREFIX, STATS

    return _missing_rows(text, [PREFIX + name for name in STATS], "stat", "stats")


def _table_rows(text: str) -> dict[str, list[str]]:
    """Return the rows of the Markdown tables in ``text``: first cell -> the other cells."""
    rows = {}
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith("|---"):
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        rows[cells[0]] = cells[1:]
    return rows


# -- commands ---------------------------------------------------------------------------------


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Return the parser of each front end, built as each builds it at run time."""
    from scrapy.settings import Settings

    from scrapy_redis_bloom.cli import BloomCommand, build_parser

    command = BloomCommand()
    command.settings = Settings()
    scrapy = argparse.ArgumentParser(prog=FRONTS["scrapy"])
    command.add_options(scrapy)
    return {"scrapy": scrapy, "alias": build_parser()}


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Return a parser's subcommands by name (argparse keeps them private)."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def _help(action: argparse.Action, prog: str) -> str:
    """Return an option's help with its ``%(default)s`` filled in, as ``--help`` prints it."""
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    params: dict[str, Any] = {
        key: value for key, value in vars(action).items() if value is not argparse.SUPPRESS
    }
    params["prog"] = prog
    return action.help % params


def _groups(sub: argparse.ArgumentParser) -> Iterator[tuple[str, list[argparse.Action]]]:
    """Yield each argument group of a subcommand with its options (help left out)."""
    for group in sub._action_groups:
        actions = [a for a in group._group_actions if not isinstance(a, argparse._HelpAction)]
        if actions:
            yield group.title or "options", actions


def _option_cell(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    metavar = action.metavar if action.nargs != 0 else None
    flags = ", ".join(f"`{flag}`" for flag in action.option_strings)
    return f"{flags} `{metavar}`" if metavar else flags


def commands_page() -> str:
    """Return the commands page: per front end, per subcommand, its usage and options."""
    from scrapy_redis_bloom.cli.options import COMMANDS

    out: list[str] = []
    built = parsers()
    for front, program in FRONTS.items():
        out.append(f"## `{program}`\n\n")
        subs = subcommands(built[front])
        for command in COMMANDS:
            name = command.name if front == "scrapy" else command.alias
            if name is None:
                continue
            sub = subs[name]
            out.append(f"({front}-{name})=\n### `{program} {name}`\n\n")
            out.append(f"{_cell(command.description)}\n\n")
            usage = " ".join(sub.format_usage().split()).removeprefix("usage: ")
            out.append(f"```text\n{usage}\n```\n\n")
            for title, actions in _groups(sub):
                out.append(f"**{title[:1].upper()}{title[1:]}**\n\n")
                out.append("| option | meaning |\n|---|---|\n")
                out.extend(
                    f"| {_option_cell(a)} | {_cell(_help(a, sub.prog))} |\n" for a in actions
                )
                out.append("\n")
    return "".join(out)


def commands_problems(text: str) -> list[str]:
    """Name each command, or option of one, without an entry (or without its meaning)."""
    from scrapy_redis_bloom.cli.options import COMMANDS, OPTIONS

    found = []
    sections = _command_sections(text)
    for front, program in FRONTS.items():
        for command in COMMANDS:
            name = command.name if front == "scrapy" else command.alias
            if name is None:
                continue
            title = f"{program} {name}"
            section = sections.get(title)
            if section is None:
                found.append(f"the command {title} has no entry in the commands reference")
                continue
            body = section.split("```", 1)[0].strip()
            if not body:
                found.append(f"the command {title} has no description in the commands reference")
            rows = _table_rows(section)
            for spec in OPTIONS:
                if command.name not in (spec.scrapy if front == "scrapy" else spec.alias):
                    continue
                names = set(spec.flags) if spec.flags[0].startswith("-") else {_metavar(spec)}
                cells = next(
                    (cells for first, cells in rows.items() if names <= _names(first)), None
                )
                if cells is None:
                    found.append(f"{title}: the option {spec.flags[-1]} has no entry")
                elif not cells[-1].strip():
                    found.append(f"{title}: the option {spec.flags[-1]} has no meaning")
    return found


def _metavar(spec: Any) -> str:
    """Return the name a positional argument is shown by (its metavar, else its name)."""
    return str(spec.kwargs.get("metavar") or spec.flags[0])


def _names(cell: str) -> set[str]:
    """Return the flags (or argument name) an option cell of the commands page names."""
    codes = re.findall(r"`([^`]+)`", cell)
    flags = {code for code in codes if code.startswith("-")}
    return flags or set(codes[:1])


def _command_sections(text: str) -> dict[str, str]:
    """Return each ``### `command` `` section of the commands page, by command."""
    parts = re.split(r"^### `([^`]+)`\n", text, flags=re.M)
    return {parts[i]: parts[i + 1].split("\n(", 1)[0] for i in range(1, len(parts) - 1, 2)}


# -- the pages --------------------------------------------------------------------------------

#: Each generated page: how it is built, and how its entries are checked.
PAGES: dict[str, tuple[Callable[[], str], Callable[[str], list[str]]]] = {
    "settings": (settings_page, settings_problems),
    "stats": (stats_page, stats_problems),
    "commands": (commands_page, commands_problems),
}


def build() -> dict[str, str]:
    """Return every generated page's Markdown, by name."""
    return {name: make() for name, (make, _) in PAGES.items()}


def problems(pages: dict[str, str]) -> list[str]:
    """Return what is missing from the pages (nothing when every entry is documented)."""
    return [problem for name, (_, check) in PAGES.items() for problem in check(pages[name])]


def write(directory: Path = GENERATED) -> dict[str, str]:
    """Write the generated pages into ``directory`` (only those that changed); return them."""
    pages = build()
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in pages.items():
        path = directory / f"{name}.md"
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    return pages


def _generate(app: Any) -> None:
    """Sphinx ``builder-inited``: write the pages; fail the build on a missing entry."""
    from sphinx.errors import ExtensionError

    found = problems(write())
    if found:
        raise ExtensionError("the generated reference is incomplete:\n" + "\n".join(found))


def setup(app: Any) -> dict[str, Any]:
    """Register the hook that writes the reference pages before Sphinx reads the sources."""
    app.connect("builder-inited", _generate)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

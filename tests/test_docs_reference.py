"""The docs' generated reference has an entry, with its meaning, for everything the code has.

The settings, stats and commands pages are built in-process by the docs' own extension
(``docs/_ext/srb_reference.py``, the code the Sphinx build runs): every setting of
``SETTINGS``, every stat of ``STATS`` and every command and option of both front ends
must have an entry with its meaning. The check itself is tested too: taking one entry's
documentation away (a blank meaning, a command or option without help) makes it fail.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from scrapy_redis_bloom.cli import options
from scrapy_redis_bloom.core import settings
from scrapy_redis_bloom.scrapy import stats

ROOT = Path(__file__).resolve().parent.parent
EXTENSION = ROOT / "docs" / "_ext" / "srb_reference.py"


@pytest.fixture(scope="module")
def reference() -> ModuleType:
    """Import the docs' extension as the Sphinx build does (without Sphinx)."""
    spec = importlib.util.spec_from_file_location("srb_reference", EXTENSION)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_entry_is_documented(reference: ModuleType) -> None:
    pages = reference.build()
    assert reference.problems(pages) == []
    for row in settings.SETTINGS:
        assert f"`{row.name}`" in pages["settings"]
    for name in stats.STATS:
        assert f"`{stats.PREFIX}{name}`" in pages["stats"]
    for command in options.COMMANDS:
        assert f"### `scrapy bloom {command.name}`" in pages["commands"]
        if command.alias:
            assert f"### `scrapy-redis-bloom {command.alias}`" in pages["commands"]


def test_the_settings_page_is_the_code_table(reference: ModuleType) -> None:
    assert reference.settings_page() == settings.reference()


def test_the_pages_include_what_is_generated() -> None:
    """Each reference page includes its generated part, and the docs' toctree lists them."""
    for name in ("settings", "stats", "commands"):
        page = (ROOT / "docs" / "reference" / f"{name}.md").read_text(encoding="utf-8")
        assert f"```{{include}} generated/{name}.md\n```" in page, name
    index = (ROOT / "docs" / "reference" / "index.md").read_text(encoding="utf-8")
    assert {"settings", "stats", "commands", "api"} <= set(index.split())


def test_a_stat_without_meaning_fails(
    reference: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(stats.STATS, "grown", "")
    assert reference.problems(reference.build()) == [
        "the stat bloomfilter/grown has no meaning in the stats reference"
    ]


def test_a_stat_without_row_fails(reference: ModuleType) -> None:
    page = "\n".join(
        line for line in reference.stats_page().splitlines() if "bloomfilter/full`" not in line
    )
    assert reference.stats_problems(page) == [
        "the stat bloomfilter/full has no row in the stats reference"
    ]


def test_a_setting_without_meaning_fails(
    reference: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    blank = tuple(
        dataclasses.replace(row, meaning="") if row.name == "BLOOMFILTER_TTL" else row
        for row in settings.SETTINGS
    )
    monkeypatch.setattr(settings, "SETTINGS", blank)
    assert reference.problems(reference.build()) == [
        "the setting BLOOMFILTER_TTL has no meaning in the settings reference"
    ]


def test_a_setting_without_row_fails(reference: ModuleType) -> None:
    page = "\n".join(
        line for line in settings.reference().splitlines() if "`BLOOMFILTER_SHARDS`" not in line
    )
    assert reference.settings_problems(page) == [
        "the setting BLOOMFILTER_SHARDS has no row in the settings reference"
    ]


def test_a_command_or_option_without_help_fails(
    reference: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands = tuple(
        dataclasses.replace(c, description="") if c.name == "watch" else c for c in options.COMMANDS
    )
    opts = tuple(
        dataclasses.replace(o, kwargs={**o.kwargs, "help": ""}) if o.flags == ("--urls",) else o
        for o in options.OPTIONS
    )
    monkeypatch.setattr(options, "COMMANDS", commands)
    monkeypatch.setattr(options, "OPTIONS", opts)
    assert reference.problems(reference.build()) == [
        "scrapy bloom add: the option --urls has no meaning",
        "scrapy bloom check: the option --urls has no meaning",
        "the command scrapy bloom watch has no description in the commands reference",
    ]


def test_a_command_without_entry_fails(reference: ModuleType) -> None:
    page = reference.commands_page().replace("### `scrapy-redis-bloom reset`", "### reset")
    assert reference.commands_problems(page) == [
        "the command scrapy-redis-bloom reset has no entry in the commands reference"
    ]

"""The table of settings is the truth: the docs show it, the code reads every row of it.

``SETTINGS`` in ``core/settings.py`` holds each setting's type, default, range and meaning
once. These tests fail when the docs' settings reference is not ``reference()``'s output
(it is generated at build time by ``docs/_ext/srb_reference.py``), when the package reads
a ``BLOOMFILTER_*`` setting the table lacks, when the README or a docs page names a setting
that does not exist, when a row is not checked where the setting is read, or when a reader
outside ``core/settings.py`` (batching, the add-on) disagrees with its row.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
from scrapy.settings import Settings

from scrapy_redis_bloom import Addon
from scrapy_redis_bloom.cli import options
from scrapy_redis_bloom.core.settings import (
    BATCH_MAX,
    BATCH_WINDOW,
    BIT,
    SETTINGS,
    BloomConfig,
    Setting,
    reference,
    setting,
)

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: The docs' page of settings, and the generated table it includes.
PAGE = DOCS / "reference" / "settings.md"
#: The settings the commands' sizing options stand for.
SIZING_OPTIONS = [spec.setting for spec in options.OPTIONS if spec.group == options.SIZING]
INCLUDE = "```{include} generated/settings.md\n```"
#: A setting's name where it is written out; a name ending in ``_`` is a prefix
#: (``BLOOMFILTER_REDIS_*``), not a setting.
NAME = re.compile(r"\bBLOOMFILTER_[A-Z0-9_]+\b")


def generated_table() -> str:
    """Return the settings table the docs' extension generates (as the Sphinx build does)."""
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import srb_reference
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    table: str = srb_reference.settings_page()
    return table


def test_the_docs_table_is_the_generated_one() -> None:
    assert INCLUDE in PAGE.read_text(encoding="utf-8"), (
        "docs/reference/settings.md no longer includes the generated settings table"
    )
    assert generated_table() == reference(), (
        "the docs' settings table differs from scrapy_redis_bloom.core.settings.reference()"
    )


def names_in(paths: list[Path]) -> set[str]:
    """Return the setting names written in these files (prefixes left out)."""
    return {
        name
        for path in paths
        for name in NAME.findall(path.read_text(encoding="utf-8"))
        if not name.endswith("_")
    }


def test_every_setting_the_package_reads_has_a_row() -> None:
    read = names_in(sorted((ROOT / "scrapy_redis_bloom").rglob("*.py")))
    assert read, "no BLOOMFILTER_ name found in the package"
    missing = read - {row.name for row in SETTINGS}
    assert not missing, f"settings the package names without a row in SETTINGS: {missing}"


def test_every_setting_the_readme_and_docs_name_has_a_row() -> None:
    pages = [ROOT / "README.md", *(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)]
    missing = names_in(pages) - {row.name for row in SETTINGS}
    assert not missing, f"the README or the docs name settings that do not exist: {missing}"


def test_each_setting_has_one_row_with_a_meaning() -> None:
    names = [row.name for row in SETTINGS]
    assert len(names) == len(set(names))
    for row in SETTINGS:
        assert row is setting(row.name)
        assert row.meaning, row.name
        assert "|" not in row.meaning, row.name
        assert row.kind != "text" or row.parse is not None, row.name
        assert row.kind not in ("int", "float", "choice") or row.rule, row.name
    assert {setting(name) for name in SIZING_OPTIONS} <= set(SETTINGS)


#: Values every reader must refuse, by kind, and what each text setting refuses.
BAD: dict[str, object] = {"int": "many", "float": "soon", "bool": "maybe", "choice": "bogus"}
#: Settings that only mean something with another: given so the value itself is checked.
WITH: dict[str, dict[str, Any]] = {
    "BLOOMFILTER_REDIS_SENTINELS": {"BLOOMFILTER_REDIS_SENTINEL_SERVICE": "mymaster"},
    "BLOOMFILTER_REDIS_SENTINEL_SERVICE": {"BLOOMFILTER_REDIS_SENTINELS": ["h:26379"]},
    "BLOOMFILTER_ERROR_RATE": {"BLOOMFILTER_CAPACITY": 1000},
}


def read_all(values: dict[str, Any]) -> None:
    """Read settings as a crawl does: the add-on (batching and all), then the filter's config."""
    settings = Settings({"BLOOMFILTER_ADDON_BATCHING": True, **values})
    Addon().update_settings(settings)
    BloomConfig.from_settings(settings)


@pytest.mark.parametrize("row", SETTINGS, ids=lambda row: row.name)
def test_every_row_is_checked_where_it_is_read(row: Setting[Any]) -> None:
    bad = BAD.get(row.kind, 5)  # no text setting takes the number 5
    with pytest.raises(ValueError, match=rf"The value of the {row.name}\b.* is invalid"):
        read_all({row.name: bad, **WITH.get(row.name, {})})


@pytest.mark.parametrize(
    "row", [row for row in SETTINGS if row.kind in ("int", "float")], ids=lambda row: row.name
)
def test_ranges_are_checked_at_their_edges(row: Setting[Any]) -> None:
    step = 1 if row.kind == "int" else 1e-9
    if row.low is not None:
        edge = row.low + step if row.open else row.low
        assert row.check(str(edge)) == edge
        below = row.low if row.open else row.low - step
        if not (row.zero and below == 0):
            with pytest.raises(ValueError, match=re.escape(row.message)):
                row.check(below)
    if row.high is not None:
        edge = row.high - step if row.open else row.high
        assert row.check(edge) == edge
        with pytest.raises(ValueError, match=re.escape(row.message)):
            row.check(row.high if row.open else row.high + step)
    if row.zero:
        assert row.check(0) == 0


def test_the_defaults_are_what_a_crawl_gets() -> None:
    config = BloomConfig.from_settings({})
    got = {
        "BLOOMFILTER_KEY": config.key,
        "BLOOMFILTER_BIT": config.sizing.bit,
        "BLOOMFILTER_HASH_NUMBER": config.sizing.hash_number,
        "BLOOMFILTER_CAPACITY": config.sizing.capacity,
        "BLOOMFILTER_SHARDS": config.sizing.shards,
        "BLOOMFILTER_BLOCKED": config.sizing.blocked,
        "BLOOMFILTER_EXPANSION": config.expansion,
        "BLOOMFILTER_TTL": config.ttl,
        "BLOOMFILTER_FINGERPRINTER": config.fingerprinter,
        "BLOOMFILTER_WORKER_TTL": config.worker_ttl,
        "BLOOMFILTER_CACHE_SIZE": config.cache_size,
        "BLOOMFILTER_RETRY_TIMEOUT": config.faults.retry_timeout,
        "BLOOMFILTER_ON_ERROR": config.faults.on_error,
        "BLOOMFILTER_ON_LOSS": config.faults.on_loss,
        "BLOOMFILTER_BACKEND": config.backend,
        "BLOOMFILTER_MONITOR_MAX_FPR": config.monitor_max_fpr,
        "BLOOMFILTER_REDIS_URLS": config.connection.urls,
        "BLOOMFILTER_REDIS_CLUSTER": config.connection.cluster,
        "BLOOMFILTER_REDIS_SENTINELS": config.connection.sentinels,
        "BLOOMFILTER_REDIS_SENTINEL_SERVICE": config.connection.service,
    }
    assert got == {name: setting(name).default for name in got}
    rate = BloomConfig.from_settings({"BLOOMFILTER_CAPACITY": 1000}).sizing.error_rate
    assert rate == setting("BLOOMFILTER_ERROR_RATE").default


def test_batching_agrees_with_its_rows() -> None:
    """The batching settings read from Scrapy settings: their defaults, ranges and messages."""
    empty = Settings()
    assert BATCH_MAX.read(empty) == BATCH_MAX.default
    assert BATCH_WINDOW.read(empty) == BATCH_WINDOW.default
    assert BATCH_WINDOW.read(Settings({BATCH_WINDOW.name: BATCH_WINDOW.high})) == 10
    for row, reader, bad in (
        (BATCH_MAX, BATCH_MAX.read, 0),
        (BATCH_WINDOW, BATCH_WINDOW.read, 10.5),
    ):
        with pytest.raises(ValueError, match=re.escape(row.message)):
            reader(Settings({row.name: bad}))


def test_summary_gives_a_command_its_help() -> None:
    assert BIT.summary() == "BLOOMFILTER_BIT (int, 1\N{EN DASH}47; default 30)"
    sizing = set(SIZING_OPTIONS)
    assert {"BLOOMFILTER_CAPACITY", "BLOOMFILTER_ERROR_RATE", "BLOOMFILTER_BIT"} <= sizing
    assert "BLOOMFILTER_KEY" not in sizing

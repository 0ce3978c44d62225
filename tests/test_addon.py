"""The Scrapy add-on: ``ADDONS = {"scrapy_redis_bloom.Addon": 100}`` alone turns the filter on.

Real crawls (``crawl_runner.py`` against the local site and the session's redis-server)
with no ``DUPEFILTER_CLASS`` line: the add-on sets it, and with its settings also
scrapy-redis's Scheduler and the batching middleware. A bad filter setting stops the
crawl before any request, with the setting's ValueError. The refusals of a contradicting
project setting are checked on Scrapy's own ``Settings``, as Scrapy hands them to it.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from scrapy.settings import Settings
from scrapy_redis.scheduler import Scheduler as RedisScheduler
from test_crawl import PAGES, assert_finished, crawl, filter_keys
from website import Site, SiteServer

from scrapy_redis_bloom import Addon
from scrapy_redis_bloom.scrapy.addon import BATCHING, DUPEFILTER, REDIS_SCHEDULER, SCHEDULER
from scrapy_redis_bloom.scrapy.dupefilter import RFPDupeFilter

ADDON = {"scrapy_redis_bloom.Addon": 100}
#: The runner's base settings name the dupefilter and the scheduler: remove both lines.
NO_COMPONENTS: dict[str, Any] = {"DUPEFILTER_CLASS": None, "SCHEDULER": None, "ADDONS": ADDON}


@pytest.fixture
def site_server() -> Iterator[SiteServer]:
    with SiteServer(Site(PAGES)) as server:
        yield server


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scrapy_redis_scheduler", [True, False])
def test_the_addon_alone_activates_the_filter(
    scrapy_redis_scheduler: bool,
    site_server: SiteServer,
    redis_url: str,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    settings = {**NO_COMPONENTS, "BLOOMFILTER_ADDON_SCHEDULER": scrapy_redis_scheduler}
    result = crawl(
        site_server,
        redis_url,
        tmp_path,
        mode="seed003",
        settings=settings,
        spider_name="addon",
    )

    assert_finished(result)
    stats = result.stats
    assert result.output["offered"] == 110
    assert stats["bloomfilter/filtered"] == 10  # our filter dropped the 10 duplicates
    assert stats["dupefilter/filtered"] == 10
    assert stats["bloomfilter/added"] == 100
    assert stats["bloomfilter/capacity"] == 100_000
    served = site_server.hits_snapshot()
    assert served == collections.Counter({f"/search?wd={wd}": 1 for wd in range(100)})
    assert "Enabled addons" in result.log
    assert "scrapy_redis_bloom.scrapy.addon.Addon" in result.log
    if scrapy_redis_scheduler:
        assert stats["scheduler/enqueued/redis"] == 100  # scrapy-redis's queue
    else:
        assert "scheduler/enqueued/redis" not in stats
        assert stats["scheduler/enqueued"] == 100
        assert "addon:bloomfilter:meta" in filter_keys(redis_client, "addon")


@pytest.mark.timeout(120)
def test_the_addon_enables_batching_when_asked(
    site_server: SiteServer, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    settings = {**NO_COMPONENTS, "BLOOMFILTER_ADDON_BATCHING": True}
    result = crawl(site_server, redis_url, tmp_path, mode="follow", settings=settings)

    assert_finished(result)
    stats = result.stats
    assert stats["bloomfilter/batches"] > 0
    assert stats["bloomfilter/batched"] > stats["bloomfilter/batches"]
    assert "bloomfilter/batching_disabled" not in stats
    assert stats["response_received_count"] == len(site_server.site.reachable())


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            {"BLOOMFILTER_ERROR_RATE": 2},
            "The value of the BLOOMFILTER_ERROR_RATE setting (2) is invalid. It must be a"
            " number strictly between 0 and 1",
        ),
        (
            {"BLOOMFILTER_ON_ERROR": "ignore"},
            "The value of the BLOOMFILTER_ON_ERROR setting ('ignore') is invalid.",
        ),
        (
            {"BLOOMFILTER_REDIS_SENTINELS": ["127.0.0.1:26379"]},
            "The BLOOMFILTER_REDIS_SENTINELS setting needs BLOOMFILTER_REDIS_SENTINEL_SERVICE",
        ),
        (
            {"BLOOMFILTER_ADDON_SCHEDULER": "sometimes"},
            "The value of the BLOOMFILTER_ADDON_SCHEDULER setting ('sometimes') is invalid.",
        ),
        (  # misspelt, it was ignored: the default sizing instead of the one meant
            {"BLOOMFILTER_CAPACTIY": 5000},
            "The setting BLOOMFILTER_CAPACTIY is unknown: no setting of scrapy-redis-bloom has"
            " this name, so its value would be ignored. Did you mean BLOOMFILTER_CAPACITY?",
        ),
    ],
)
def test_a_bad_setting_stops_the_crawl_before_it_starts(
    bad: dict[str, Any],
    message: str,
    site_server: SiteServer,
    redis_url: str,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    settings = {**NO_COMPONENTS, **bad}
    result = crawl(
        site_server, redis_url, tmp_path, mode="seed003", settings=settings, spider_name="bad"
    )

    assert result.returncode == 1
    # A ValueError (Scrapy's convention for a bad setting): SettingError, which the
    # command-line front end words in its options.
    assert "ValueError" in result.output["error"]["bases"], result.output["error"]
    assert result.output["error"]["message"].startswith(message)
    assert message in result.log
    assert site_server.hits_snapshot() == collections.Counter()  # not one request
    assert redis_client.keys("*") == []  # nothing written


def project_settings(**values: Any) -> Settings:
    """Scrapy's settings with ``values`` at the project's priority, as settings.py gives them."""
    settings = Settings()
    settings.setdict(values, priority="project")
    return settings


def test_the_addon_sets_the_components_at_its_priority() -> None:
    settings = project_settings(BLOOMFILTER_ADDON_SCHEDULER=True, BLOOMFILTER_ADDON_BATCHING=True)
    Addon().update_settings(settings)
    assert settings["DUPEFILTER_CLASS"] == DUPEFILTER
    assert settings.getpriority("DUPEFILTER_CLASS") == 15  # "addon": the command line wins
    assert settings["SCHEDULER"] == SCHEDULER
    assert settings.getwithbase("SPIDER_MIDDLEWARES")[BATCHING] == 0


def test_without_its_settings_the_addon_sets_only_the_dupefilter() -> None:
    settings = project_settings()
    Addon().update_settings(settings)
    assert settings["DUPEFILTER_CLASS"] == DUPEFILTER
    assert settings["SCHEDULER"] == "scrapy.core.scheduler.Scheduler"
    assert BATCHING not in settings.getwithbase("SPIDER_MIDDLEWARES")


def test_a_batching_order_the_project_gives_wins() -> None:
    settings = project_settings(BLOOMFILTER_ADDON_BATCHING=True, SPIDER_MIDDLEWARES={BATCHING: 5})
    Addon().update_settings(settings)
    assert settings.getwithbase("SPIDER_MIDDLEWARES")[BATCHING] == 5


class ProjectScheduler(RedisScheduler):  # type: ignore[misc]
    """A project's own subclass of scrapy-redis's Scheduler: accepted beside the add-on."""


def test_scrapy_redis_scheduler_is_replaced_by_the_one_that_keeps_the_queue(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Its flush empties the shared queue while the filter is kept for the workers still
    # running: their queued requests were never fetched (a probe: 137 of 300 pages).
    for addon_scheduler in (False, True):
        settings = project_settings(
            SCHEDULER=REDIS_SCHEDULER, BLOOMFILTER_ADDON_SCHEDULER=addon_scheduler
        )
        with caplog.at_level(logging.INFO, logger="scrapy_redis_bloom"):
            Addon().update_settings(settings)
        assert settings["SCHEDULER"] == SCHEDULER
        assert settings.getpriority("SCHEDULER") == 20  # the project's: as it set it
        assert "but for its flush" in caplog.text
    # A project's own subclass is its own: kept (its flush asks the filter, which refuses).
    settings = project_settings(
        SCHEDULER=f"{__name__}.ProjectScheduler", BLOOMFILTER_ADDON_SCHEDULER=True
    )
    Addon().update_settings(settings)
    assert settings["SCHEDULER"] == f"{__name__}.ProjectScheduler"


class OurSubclass(RFPDupeFilter):
    """A project's own subclass of the Bloom dupefilter: accepted beside the add-on."""


def test_our_dupefilter_or_a_subclass_in_the_project_is_accepted() -> None:
    for value in (DUPEFILTER, f"{__name__}.OurSubclass", OurSubclass):
        settings = project_settings(DUPEFILTER_CLASS=value)
        Addon().update_settings(settings)
        assert settings["DUPEFILTER_CLASS"] == value


@pytest.mark.parametrize(
    ("values", "name"),
    [
        ({"DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter"}, "DUPEFILTER_CLASS"),
        ({"DUPEFILTER_CLASS": "scrapy.dupefilters.RFPDupeFilter"}, "DUPEFILTER_CLASS"),
        (
            {"DUPEFILTER_CLASS": "scrapy_redis_bloom.scrapy.dupefilter.NoSuchFilter"},
            "DUPEFILTER_CLASS",
        ),
        (
            {"SCHEDULER": "scrapy.core.scheduler.Scheduler", "BLOOMFILTER_ADDON_SCHEDULER": True},
            "SCHEDULER",
        ),
    ],
)
def test_another_component_set_by_the_project_is_refused(values: dict[str, Any], name: str) -> None:
    settings = project_settings(**values)
    with pytest.raises(ValueError, match=f"^The {name} setting .* contradicts") as refused:
        Addon().update_settings(settings)
    assert f"Remove that {name} line" in str(refused.value)
    assert settings[name] == values[name]  # left as it was


def test_a_command_line_component_is_refused_too() -> None:
    settings = Settings()
    settings.set("DUPEFILTER_CLASS", "scrapy.dupefilters.RFPDupeFilter", priority="cmdline")
    with pytest.raises(ValueError, match=r"contradicts the scrapy_redis_bloom\.Addon"):
        Addon().update_settings(settings)


def test_a_bad_redis_params_is_refused_by_the_addon() -> None:
    settings = project_settings(REDIS_PARAMS={"socket_timeout": "soon"})
    with pytest.raises(ValueError, match=r"^The value of the REDIS_PARAMS setting .* 'soon'"):
        Addon().update_settings(settings)


@pytest.mark.parametrize(
    ("name", "value"), [("BLOOMFILTER_BATCH_MAX", 0), ("BLOOMFILTER_BATCH_WINDOW", "soon")]
)
@pytest.mark.parametrize("batching", [True, False])
def test_a_bad_batching_setting_is_refused_by_the_addon(
    name: str, value: Any, batching: bool
) -> None:
    # With batching off it passed unsaid, where the README says every setting is checked.
    settings = project_settings(BLOOMFILTER_ADDON_BATCHING=batching, **{name: value})
    with pytest.raises(ValueError, match=f"^The value of the {name} setting"):
        Addon().update_settings(settings)


@pytest.mark.parametrize("scheduler", [SCHEDULER, "scrapy.core.scheduler.Scheduler"])
def test_decoded_replies_under_scrapy_redis_scheduler_are_refused(scheduler: str) -> None:
    # scrapy-redis's queue pickles requests: a client decoding replies as text cannot read
    # them back (UnicodeDecodeError at its first pop). A probe's crawl fetched 0 of 150 pages,
    # after the filter had taken the start URL for seen.
    values = {"SCHEDULER": scheduler, "REDIS_PARAMS": {"decode_responses": True}}
    settings = project_settings(**values)
    if scheduler != SCHEDULER:  # only the filter reads with that client: it copes
        Addon().update_settings(settings)
        return
    refused = r"REDIS_PARAMS sets decode_responses .* scrapy-redis's Scheduler cannot read"
    with pytest.raises(ValueError, match=refused):
        Addon().update_settings(settings)
    with pytest.raises(ValueError, match=refused):
        RFPDupeFilter.from_settings(settings)

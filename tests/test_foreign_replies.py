"""A reply that is not its command's is never read as an answer.

A proxy between the filter and a real redis-server (:class:`reply_cutter.ReplyCutter`,
``replace``) hands the filter, for one command, a reply of another shape than that
command's: an integer, a string, a short array. What Redis did with the command is
unknown, so the filter must answer nothing from the reply: a write's foreign reply is
under ``BLOOMFILTER_ON_ERROR = "raise"`` a :class:`FilterUnavailableError` saying so
(never an ``IndexError`` or a ``TypeError`` from taking the reply apart), under
``"allow"`` "new", counted in ``errors``; a read's sends the check to the script, the
authority, which answers it. The connection stays in step: the next calls are answered
as the truth has it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from cli_run import assert_one_line_error, run
from redis_server import RedisServer
from reply_cutter import Command, ReplyCutter
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_redis_bloom import BloomConfig, RedisBloomFilter
from scrapy_redis_bloom.core.errors import FilterUnavailableError
from scrapy_redis_bloom.core.settings import FaultPolicy
from scrapy_redis_bloom.dupefilter import RFPDupeFilter
from scrapy_redis_bloom.engine.backend import make_filter
from scrapy_redis_bloom.engine.bitmap import bulk
from scrapy_redis_bloom.engine.bitmap.local import HAVE_NUMPY
from scrapy_redis_bloom.engine.bitmap.wirecost import WireCost
from scrapy_redis_bloom.engine.clock import CLOCK_EVERY

#: One shard, so that every check of a state takes the same way.
GROWING = {"BLOOMFILTER_CAPACITY": 2_000, "BLOOMFILTER_ERROR_RATE": 1e-3, "BLOOMFILTER_SHARDS": 1}
#: The state of a filter, how far it is filled first, the command that answers a check,
#: and whether a foreign reply to it is an error (else the script answers the check).
STATES: dict[str, tuple[dict[str, Any], int, bytes, bool]] = {
    # A fresh shard: one BITFIELD (engine/bitmap/fastpath.py).
    "fresh": ({**GROWING, "BLOOMFILTER_EXPANSION": 0}, 100, b"BITFIELD", True),
    # Near its capacity: the script, which alone starts the next generation.
    "boundary": (GROWING, 1_995, b"EVALSHA", True),
    # Grown: the reads of every generation (engine/bitmap/stackpath.py).
    "grown": (GROWING, 5_000, b"GETRANGE", False),
    # With windows: Redis's clock, read beside them now and then (engine/clock.py).
    "windowed": ({**GROWING, "BLOOMFILTER_TTL": 3600}, 100, b"TIME", True),
}
#: Replies of another shape than any of these commands' answers.
FOREIGN = {
    "integer": b":7\r\n",
    "string": b"$2\r\nOK\r\n",
    "short-array": b"*1\r\n:7\r\n",  # (short, or one value no answer takes)
}


def fingerprints(n: int, tag: str) -> list[str]:
    return [hashlib.sha1(f"{tag}-{i}".encode()).hexdigest() for i in range(n)]


def calls(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0))


def make(client: redis.Redis, settings: dict[str, Any], on_error: str) -> RedisBloomFilter:
    faults = FaultPolicy(retry_timeout=2, on_error=on_error)  # type: ignore[arg-type]
    return RedisBloomFilter.from_config(
        client, "foreign", BloomConfig.from_settings(settings), faults=faults
    )


@pytest.mark.parametrize("reply", list(FOREIGN))
@pytest.mark.parametrize("state", list(STATES))
@pytest.mark.parametrize("on_error", ["raise", "allow"])
@pytest.mark.parametrize("batch", [False, True], ids=["one", "batch"])
def test_a_check_answered_by_a_foreign_reply_answers_nothing_from_it(
    state: str,
    reply: str,
    on_error: str,
    batch: bool,
    redis_server: RedisServer,
    redis_client: redis.Redis,
) -> None:
    """``check_and_add``, and ``check_and_add_many`` (BatchingMiddleware's) of one element."""
    settings, prefill, answering, refused = STATES[state]
    held = fingerprints(prefill, "held")
    new = fingerprints(3, "new")

    def first_answer(command: Command, _: bytes) -> bool:
        return command[0] == answering

    with ReplyCutter(redis_server.port, first_answer, replace=FOREIGN[reply]) as proxy:
        client = redis.Redis(host="127.0.0.1", port=proxy.port)
        bloom = make(client, settings, on_error)
        for element in held:
            bloom.check_and_add(element)
        check = (lambda e: bloom.check_and_add_many([e])[0]) if batch else bloom.check_and_add
        scripts = calls(redis_client, "evalsha")
        if answering == b"TIME":
            time.sleep(CLOCK_EVERY + 0.1)  # the next check reads Redis's clock again
        proxy.armed = True
        if on_error == "raise" and refused:
            with pytest.raises(FilterUnavailableError, match="not this command's"):
                check(new[0])
        else:
            assert check(new[0]) is False
            assert bloom.events.counts["errors"] == int(refused)
        proxy.armed = False
        assert proxy.cuts == [answering.decode()]  # the check met the foreign reply
        if not refused:  # the script answered it
            assert calls(redis_client, "evalsha") == scripts + 1
        # In step: the next replies are their commands' own.
        assert check(new[1]) is False
        assert check(new[1]) is True
        assert check(held[-1]) is True
        client.close()


@pytest.mark.parametrize("reply", list(FOREIGN))
@pytest.mark.parametrize("on_error", ["raise", "allow"])
def test_a_bulk_script_call_answered_by_a_foreign_reply_answers_nothing_from_it(
    reply: str, on_error: str, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """``add_many`` over a growth boundary runs the script; one call's reply is foreign."""
    held = fingerprints(1_700, "held")
    new = fingerprints(600, "new")

    def script(command: Command, _: bytes) -> bool:
        return command[0] == b"EVALSHA"

    with ReplyCutter(redis_server.port, script, replace=FOREIGN[reply]) as proxy:
        client = redis.Redis(host="127.0.0.1", port=proxy.port)
        bloom = make(client, GROWING, on_error)
        bloom.add_many(held)
        proxy.armed = True
        if on_error == "raise":
            with pytest.raises(FilterUnavailableError, match="not this command's"):
                bloom.add_many(new)
        else:
            answers = bloom.add_many(new)
            assert bloom.events.counts["errors"] > 0
            # Only what a filter of this error rate may take for seen; never the lot.
            assert answers.count(True) <= 6
        proxy.armed = False
        assert proxy.cuts == ["EVALSHA"]
        assert bloom.contains_many(held[-100:]) == [True] * 100
        client.close()


FIXED = {
    "BLOOMFILTER_CAPACITY": 20_000,
    "BLOOMFILTER_ERROR_RATE": 1e-4,
    "BLOOMFILTER_SHARDS": 3,
    "BLOOMFILTER_EXPANSION": 0,
}
#: A bulk call's ways (engine/bitmap/bulk.py), and the commands each sends.
WAYS = {
    "whole": [b"GET", b"EXEC"],  # a snapshot of each shard
    "blocks": [b"GETRANGE", b"EXEC"],  # of its batch's blocks (numpy)
    "blocks-pure": [b"EVALSHA", b"EXEC"],  # the same by the block scripts (no numpy)
    "chunks": [b"GETRANGE", b"BITFIELD"],  # no snapshot: the identity, then BITFIELDs
}


def take_way(way: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make a bulk call take ``way`` (the tests' shards are small: whole by default)."""
    if way in ("whole", "blocks") and not HAVE_NUMPY:
        pytest.skip("numpy (the numpy extra) is not installed")
    if way.startswith("blocks"):
        monkeypatch.setattr(bulk, "BLOCKS_NS_PER_ELEMENT", 1)
        monkeypatch.setattr(WireCost, "extra", lambda self, address, key: 0.0)
    if way == "blocks-pure":
        monkeypatch.setattr(bulk, "HAVE_NUMPY", False)
    if way == "chunks":
        monkeypatch.setattr(bulk, "SNAPSHOTS", False)


def outcome(call: Callable[[], list[bool]], size: int) -> tuple[list[bool], str | None]:
    """Run a call that meets a foreign reply: its answers (all "new" if it raised), its error."""
    try:
        return call(), None
    except FilterUnavailableError as exc:
        return [False] * size, str(exc)


def bulk_with_a_foreign_reply(
    redis_server: RedisServer,
    redis_client: redis.Redis,
    settings: dict[str, Any],
    prefill: int,
    answering: bytes,
    reply: str,
    on_error: str,
) -> None:
    """``add_many`` of 3,000 new elements, the first reply to ``answering`` foreign.

    No element a twin filter (the same call, nothing foreign) answers "new" is "seen"; an
    error says the reply was foreign; the elements held before stay held.
    """
    held = fingerprints(prefill, "held")
    new = fingerprints(3_000, "new")
    twin = RedisBloomFilter.from_config(redis_client, "twin", BloomConfig.from_settings(settings))
    twin.add_many(held)
    expected = twin.add_many(new)  # what the call answers when nothing is foreign

    def first(command: Command, _: bytes) -> bool:
        return command[0] == answering

    with ReplyCutter(redis_server.port, first, replace=FOREIGN[reply]) as proxy:
        client = redis.Redis(host="127.0.0.1", port=proxy.port)
        bloom = make(client, settings, on_error)
        bloom.add_many(held)
        proxy.armed = True
        answers, error = outcome(lambda: bloom.add_many(new), len(new))
        proxy.armed = False
        assert proxy.cuts == [answering.decode()]  # the call met the foreign reply
        assert [i for i, seen in enumerate(answers) if seen and not expected[i]] == []
        if error is not None:  # said, not answered
            assert on_error == "raise"
            assert "not this command's" in error
        assert bloom.contains_many(held) == [True] * len(held)
        client.close()


@pytest.mark.parametrize("reply", list(FOREIGN))
@pytest.mark.parametrize(
    ("way", "answering"), [(way, command) for way, sent in WAYS.items() for command in sent]
)
@pytest.mark.parametrize("on_error", ["raise", "allow"])
def test_a_bulk_call_answered_by_a_foreign_reply_never_answers_seen_for_a_new_element(
    way: str,
    answering: bytes,
    reply: str,
    on_error: str,
    redis_server: RedisServer,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each command of each way, its first reply foreign: a doubt, never "seen"."""
    take_way(way, monkeypatch)
    bulk_with_a_foreign_reply(redis_server, redis_client, FIXED, 3_000, answering, reply, on_error)


#: The native backend's calls and the command each sends: BF.INSERT; with re-crawl windows,
#: the script (or BF.EXISTS on the windows, then the script or BF.INSERT), and whether a
#: foreign reply to it is an error (None: an error, or the check answered by another way).
NATIVE = [
    ("fresh", "one", b"BF.INSERT", True),
    ("fresh", "bulk", b"BF.INSERT", True),
    ("fresh", "batch", b"BF.INSERT", True),
    ("windows", "one", b"BF.EXISTS", None),
    ("windows", "one", b"EVALSHA", True),
    ("windows", "bulk", b"EVALSHA", True),
    ("windows", "batch", b"EVALSHA", True),
]


@pytest.mark.parametrize("reply", list(FOREIGN))
@pytest.mark.parametrize(("state", "call", "answering", "refused"), NATIVE)
@pytest.mark.parametrize("on_error", ["raise", "allow"])
def test_a_native_check_answered_by_a_foreign_reply_answers_nothing_from_it(
    state: str,
    call: str,
    answering: bytes,
    refused: bool | None,
    reply: str,
    on_error: str,
    bloom_redis_server: RedisServer,
) -> None:
    bloom_redis_server.client().flushall()
    held = fingerprints(50, "held")
    new = fingerprints(20, "new")

    def first(command: Command, _: bytes) -> bool:
        return command[0] == answering

    with ReplyCutter(bloom_redis_server.port, first, replace=FOREIGN[reply]) as proxy:
        client = redis.Redis(host="127.0.0.1", port=proxy.port)
        config = BloomConfig.from_settings(
            {
                "BLOOMFILTER_CAPACITY": 10_000,
                "BLOOMFILTER_ERROR_RATE": 1e-3,
                "BLOOMFILTER_BACKEND": "native",
                "BLOOMFILTER_CACHE_SIZE": 0,
                "BLOOMFILTER_TTL": 3600 if state == "windows" else 0,
                # new[0] on another shard than held[0]: its window before not yet known
                "BLOOMFILTER_SHARDS": 11,
            }
        )
        faults = FaultPolicy(retry_timeout=2, on_error=on_error)  # type: ignore[arg-type]
        bloom = make_filter([client], "native-foreign", config, faults=faults)
        bloom.add_many(held)
        bloom.check_and_add(held[0])  # the window is known
        proxy.armed = True
        calls = {
            "one": lambda: [bloom.check_and_add(new[0])],
            "bulk": lambda: bloom.add_many(new),
            "batch": lambda: bloom.check_and_add_many(new),
        }
        answers, error = outcome(calls[call], len(new))
        proxy.armed = False
        assert proxy.cuts == [answering.decode()]  # the call met the foreign reply
        assert True not in answers
        if error is not None:  # said, not answered
            assert on_error == "raise"
            assert refused is not False
            assert "not this command's" in error
        elif refused:
            assert bloom.events.counts["errors"] > 0
        assert bloom.check_and_add(new[-1]) is (call != "one")
        assert bloom.contains_many(held) == [True] * len(held)
        bloom.close()
        client.close()


#: Bulk calls on a grown filter and on one with windows (stacks, engine/bitmap/stacks.py,
#: and the script at the growth boundary), and the commands they send.
STACKED = [
    (state, command)
    for state, commands in (
        ("grown", [b"GET", b"GETRANGE", b"EVALSHA"]),
        ("windowed", [b"GET", b"GETRANGE", b"EVALSHA", b"TIME"]),
    )
    for command in commands
]


@pytest.mark.parametrize("reply", list(FOREIGN))
@pytest.mark.parametrize(("state", "answering"), STACKED)
@pytest.mark.parametrize("on_error", ["raise", "allow"])
def test_a_stacked_bulk_call_answered_by_a_foreign_reply_never_answers_seen_for_a_new_element(
    state: str,
    answering: bytes,
    reply: str,
    on_error: str,
    redis_server: RedisServer,
    redis_client: redis.Redis,
) -> None:
    settings = {**GROWING, "BLOOMFILTER_TTL": 3600 if state == "windowed" else 0}
    bulk_with_a_foreign_reply(
        redis_server, redis_client, settings, 5_000, answering, reply, on_error
    )


class BooksSpider(Spider):
    name = "books"


#: A worker's calls off the hot path (opening, leases, counters, the state in its stats),
#: each picked by its name and an argument (the first such reply is replaced), and the
#: foreign replies of its own command's shape, which no check can tell from a true one.
LIFE: dict[str, tuple[bytes, bytes, set[str]]] = {
    "handshake": (b"HELLO", b"", set(FOREIGN)),  # not sent: the connection is made again
    "server version": (b"INFO", b"server", set()),
    "backend probe": (b"COMMAND", b"BF.INSERT", set()),
    "record read": (b"HGETALL", b":meta", set()),
    "lease": (b"EVALSHA", b":workers", {"integer"}),
    "counters sync": (b"HINCRBY", b":count", {"integer"}),
    "counters read": (b"HMGET", b":count", set()),
    "generations read": (b"GETRANGE", b"31", {"string"}),  # a header: 0 to HEADER_BYTES - 1
    "bits counted": (b"BITCOUNT", b":g0", {"integer"}),
    "memory read": (b"MEMORY", b":g0", {"integer"}),
}


@pytest.mark.parametrize("reply", list(FOREIGN))
@pytest.mark.parametrize("call", list(LIFE))
def test_a_workers_calls_answered_by_a_foreign_reply_raise_no_raw_error(
    call: str,
    reply: str,
    redis_server: RedisServer,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Opening, leasing, counting and reading the state: nothing read from a foreign reply.

    Opening fails with the error that says so, or the crawl goes on and the worker says
    what it met: no ``ValueError``, ``TypeError`` or ``AttributeError`` from taking the
    reply apart, no count or state made up of it, and never "seen" for a new URL.
    """
    name, argument, own = LIFE[call]
    caplog.set_level(logging.INFO)

    def picked(command: Command, _: bytes) -> bool:
        arguments = command[1:] or [b""]
        return (
            command[0] == name
            and any(argument in part for part in arguments)
            and not any(b"acl-probe" in part for part in arguments)  # engine/access.py's
        )

    urls = [f"http://books.test/{i}" for i in range(20)]
    with ReplyCutter(redis_server.port, picked, replace=FOREIGN[reply]) as proxy:
        proxy.armed = True
        settings = {
            "REDIS_URL": f"redis://127.0.0.1:{proxy.port}",
            "BLOOMFILTER_CAPACITY": 100_000,
            "BLOOMFILTER_ON_ERROR": "allow",
            "BLOOMFILTER_RETRY_TIMEOUT": 2,
        }
        crawler = get_crawler(BooksSpider, settings)
        crawler.spider = BooksSpider()
        failed: FilterUnavailableError | None = None
        try:
            dupefilter = RFPDupeFilter.from_crawler(crawler)
        except FilterUnavailableError as exc:  # opening: nothing to answer from yet
            failed = exc
        if failed is not None:
            assert reply not in own
            assert "not this command's" in str(failed)
            assert proxy.cuts == [name.decode()]
            return
        answers = [dupefilter.request_seen(Request(url)) for url in urls + urls[:5]]
        dupefilter.close("finished")
    if name == b"HELLO" and not proxy.cuts:
        pytest.skip("this redis-py sends no HELLO (RESP2, the default of older releases)")
    assert proxy.cuts == [name.decode()]  # the worker met the foreign reply
    assert answers == [False] * 20 + [True] * 5
    said = [r.getMessage() for r in caplog.records if r.name.startswith("scrapy_redis_bloom")]
    told = [m for m in said if "not this command's" in m or "names no version" in m]
    assert bool(told) == (reply not in own), said


#: Operations (the command line) and the call each meets a foreign reply at first.
OPERATIONS = {
    "info: counters": ("info", b"HMGET", b":count"),
    "info: live workers": ("info", b"EVALSHA", b":workers"),
    "info: memory": ("info", b"MEMORY", b":g0"),
    "check: keys counted": ("check", b"DBSIZE", b""),
    "check: record": ("check", b"HGETALL", b":meta"),
}


@pytest.mark.parametrize("reply", ["string", "short-array"])
@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_an_operation_answered_by_a_foreign_reply_fails_saying_so(
    operation: str,
    reply: str,
    redis_server: RedisServer,
    redis_client: redis.Redis,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """One line naming the reply, exit status 1: no traceback, no figure made up of it."""
    command, name, argument = OPERATIONS[operation]
    held = tmp_path / "held.txt"
    held.write_text("".join(f"{i:040x}\n" for i in range(2_500)))
    url = f"redis://127.0.0.1:{redis_server.port}"
    added = run(capsys, "add", "--redis-url", url, "--key", "ops", "--capacity", "1000", str(held))
    assert added[0] == 0

    def picked(command: Command, _: bytes) -> bool:
        return command[0] == name and any(argument in part for part in command[1:] or [b""])

    with ReplyCutter(redis_server.port, picked, replace=FOREIGN[reply]) as proxy:
        proxy.armed = True
        argv = [command, "--redis-url", f"redis://127.0.0.1:{proxy.port}", "--key", "ops"]
        code, _, err = run(capsys, *argv, *([str(held)] if command == "check" else []))
    assert proxy.cuts == [name.decode()]
    assert code == 1
    assert_one_line_error(err)
    assert "not this command's" in err

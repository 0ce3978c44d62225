"""Bulk calls on grown and windowed filters: stacks of generations, the script at the edges.

Against a real redis-server: a grown filter's and a windowed filter's bulk calls run no
script away from the boundaries (one transaction per node and block); a generation or
window lost between or during bulk calls is found (raised, or recreated as asked), as
the script finds it; a window in its last seconds, or a batch that would reach a
generation's capacity, is left to the script; a lost ``EXEC`` reply answers "new".
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from redis_server import RedisServer
from reply_cutter import ReplyCutter
from test_bulk import calls, fingerprints, make

from scrapy_redis_bloom import FaultPolicy, FilterDamagedError
from scrapy_redis_bloom.core.generations import COUNT_BIT, GENERATIONS_BIT
from scrapy_redis_bloom.engine.bitmap import bulk, stacks
from scrapy_redis_bloom.engine.bitmap.local import HAVE_NUMPY

GROWN = {"BLOOMFILTER_CAPACITY": 3_000, "BLOOMFILTER_ERROR_RATE": 1e-3, "BLOOMFILTER_SHARDS": 2}
#: Windows whose first generation takes a call of 6,000 without the script.
WINDOWED = {**GROWN, "BLOOMFILTER_CAPACITY": 20_000, "BLOOMFILTER_TTL": 3_600}
#: Elements that grow GROWN to three generations per shard.
HELD = 12_000


@pytest.fixture(params=["numpy", "pure"])
def numpy(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether the bulk path uses numpy (else the pure-Python path of a default install)."""
    if request.param == "numpy" and not HAVE_NUMPY:
        pytest.skip("numpy (the numpy extra) is not installed")
    if request.param == "pure":
        monkeypatch.setattr(bulk, "HAVE_NUMPY", False)
    return request.param == "numpy"


def grown(client: redis.Redis, key: str, **faults: Any) -> Any:
    """Return a two-shard filter grown to three generations per shard."""
    bloom = make(client, GROWN, key, faults=FaultPolicy(**faults))
    bloom.add_many(fingerprints(HELD, "held"))
    heads = [f"{{{key}:{s}}}:g0" for s in (0, 1)]
    assert min(client.bitfield(head).get("u16", 208).execute()[0] for head in heads) >= 3
    return bloom


def twin(client: redis.Redis, key: str, name: str) -> None:
    """Copy every key of the filter ``key`` to the filter ``name``: the same filter twice."""
    for found in client.keys(f"*{key}*"):
        client.copy(found, found.decode().replace(key, name))


def test_a_grown_filters_bulk_calls_run_no_script(numpy: bool, redis_client: redis.Redis) -> None:
    reference = grown(redis_client, "reference")
    twin(redis_client, "reference", "stacked")
    held, new = fingerprints(HELD, "held"), fingerprints(1_000, "new")
    expected = [reference.check_and_add(e) for e in held + new]  # the script, element by element
    reference.close()  # (its scriptless checks send their counts late)
    assert expected.count(False) >= 990  # a few false positives at 1e-3
    bloom = make(redis_client, GROWN, "stacked")
    bloom.open()
    redis_client.config_resetstat()
    assert bloom.add_many(held + new) == expected
    assert bloom.contains_many(new + fingerprints(500, "never"))[:1_000] == [True] * 1_000
    assert calls(redis_client, "evalsha") == 0
    assert calls(redis_client, "exec") >= 1
    for s in (0, 1):  # the same bits as one check at a time, and the same counts
        for g in range(4):
            mine = redis_client.get(f"{{stacked:{s}}}:g{g}")
            assert mine == redis_client.get(f"{{reference:{s}}}:g{g}"), (s, g)


def test_a_windowed_filters_bulk_calls_run_no_script_inside_a_window(
    numpy: bool, redis_client: redis.Redis
) -> None:
    reference = make(redis_client, WINDOWED, "reference")
    elements = fingerprints(6_000, "w")
    assert reference.add_many(elements[:100]) == [False] * 100  # starts the window (the script)
    twin(redis_client, "reference", "windows")
    expected = [reference.check_and_add(e) for e in elements]
    reference.close()
    bloom = make(redis_client, WINDOWED, "windows")
    bloom.open()
    redis_client.config_resetstat()
    assert bloom.add_many(elements) == expected
    assert calls(redis_client, "exec") >= 1
    assert calls(redis_client, "evalsha") == 0
    assert calls(redis_client, "time") >= 2
    assert bloom.contains_many(elements) == [True] * len(elements)
    for found in redis_client.keys("{windows:*}:w*"):
        theirs = found.decode().replace("windows", "reference")
        assert redis_client.get(found) == redis_client.get(theirs), found


def test_a_window_in_its_last_seconds_is_the_scripts(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    bloom = make(redis_client, WINDOWED, "late")
    bloom.add_many(fingerprints(10, "start"))
    monkeypatch.setattr(stacks, "GUARD", 3_600)  # every moment is a window's last ones
    redis_client.config_resetstat()
    elements = fingerprints(1_000, "late")
    assert bloom.add_many(elements) == [False] * 1_000
    assert calls(redis_client, "exec") == 0
    assert calls(redis_client, "evalsha") > 0
    monkeypatch.setattr(stacks, "GUARD", 1.0)
    assert bloom.add_many(elements) == [True] * 1_000


def test_a_generation_lost_between_bulk_calls_raises_by_default(
    numpy: bool, redis_client: redis.Redis
) -> None:
    bloom = grown(redis_client, "lost")
    redis_client.delete("{lost:1}:g1")
    with pytest.raises(FilterDamagedError, match="g1"):
        bloom.add_many(fingerprints(HELD, "held"))


def test_a_generation_lost_during_a_bulk_call_is_found_and_recreated(
    numpy: bool, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    bloom = grown(redis_client, "gone", on_loss="recreate")
    copy = stacks._copy
    deleted: list[int] = []

    def losing_a_generation(*args: Any) -> Any:
        if not deleted:  # between the reads and the EXEC, generation 1 of shard 0 is lost
            deleted.append(redis_client.delete("{gone:0}:g1"))
        return copy(*args)

    monkeypatch.setattr(stacks, "_copy", losing_a_generation)
    held = fingerprints(HELD, "held")
    answers = bloom.add_many(held + fingerprints(500, "new"))
    assert deleted == [1]
    assert bloom.events.counts["recreated"] >= 1
    assert answers[len(held) :] == [False] * 500
    # What generation 1 held is new again (a duplicate fetch at worst); nothing else is.
    assert 0 < answers[: len(held)].count(False) < len(held) // 2
    assert redis_client.strlen("{gone:0}:g1") > 32
    assert bloom.contains_many(held) == [True] * len(held)


def test_a_window_lost_during_a_bulk_call_is_found(
    numpy: bool, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    bloom = make(redis_client, WINDOWED, "wgone")
    bloom.add_many(fingerprints(100, "start"))
    window = int(redis_client.time()[0]) // 3_600
    copy = stacks._copy
    deleted: list[int] = []

    def losing_the_window(*args: Any) -> Any:
        if not deleted:
            deleted.append(redis_client.delete(f"{{wgone:0}}:w{window}:g0"))
        return copy(*args)

    monkeypatch.setattr(stacks, "_copy", losing_the_window)
    with pytest.raises(FilterDamagedError, match=f"w{window}:g0"):
        bloom.add_many(fingerprints(2_000, "more"))
    assert deleted == [1]


def test_a_connection_dropped_between_a_stacks_read_and_its_exec_leaves_no_doubt(
    numpy: bool, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dropped after the read, before the write-back is sent: found closed, nothing sent.

    The elements are answered anew, each as the truth has it, none in doubt. (A write-back
    whose reply is lost: the ReplyCutter tests, here and in tests/test_bulk.py, whose
    "windowed" filter is the stacks'.)
    """
    bloom = grown(redis_client, "doubt")
    held = fingerprints(HELD, "held")
    batch = held + fingerprints(500, "new")
    copy = stacks._copy
    killed: list[int] = []

    def dropping_the_connection(*args: Any) -> Any:
        if not killed:  # the filter's connection dies before its EXEC is sent
            killed.append(redis_client.client_kill_filter(_type="normal", skipme=True))
        return copy(*args)

    monkeypatch.setattr(stacks, "_copy", dropping_the_connection)
    answers = bloom.add_many(batch)
    assert killed
    assert killed[0] >= 1
    assert answers == [True] * len(held) + [False] * 500
    assert bloom.events.counts["ambiguous"] == 0
    assert bloom.contains_many(batch) == [True] * len(batch)


@pytest.mark.parametrize("held", [2_500, 3_000], ids=["near its limit", "at its capacity"])
def test_a_shard_full_to_its_limit_answers_what_it_holds_without_the_script(
    numpy: bool, redis_client: redis.Redis, held: int
) -> None:
    """Elements a shard full to its limit already holds are answered by its read.

    Only the script takes a shard over its generation's boundary, so there a bulk call's
    new elements are the script's; those the shard holds need no add. Before, every
    element of every such call ran the script: re-adding a list near the filter's
    capacity ran 10-20x slower than anywhere else.
    """
    reference = make(redis_client, GROWN, "reference")
    elements = fingerprints(held, "held")
    reference.add_many(elements)
    twin(redis_client, "reference", "edge")
    mixed = elements[::2] + fingerprints(300, "new") + elements[1::2]
    bloom = make(redis_client, GROWN, "edge")
    bloom.open()
    redis_client.config_resetstat()
    assert bloom.add_many(elements) == [True] * held
    assert calls(redis_client, "evalsha") == 0
    assert bloom.generations == 1  # still at the edge of its first generation
    # New elements among them: the answers of one check at a time, in order, and the
    # script takes the shards over the boundary.
    expected = [reference.check_and_add(e) for e in mixed]
    reference.close()
    assert expected.count(False) >= 290
    assert bloom.add_many(mixed) == expected
    assert calls(redis_client, "evalsha") > 0
    assert bloom.contains_many(mixed) == [True] * len(mixed)
    for s in (0, 1):  # the same generations and counts as one check at a time
        mine, theirs = (
            redis_client.bitfield(f"{{{key}:{s}}}:g0")
            .get("u16", GENERATIONS_BIT)
            .get("u32", COUNT_BIT)
            .execute()
            for key in ("edge", "reference")
        )
        assert mine == theirs, s


@pytest.mark.parametrize("filled", [2_500, 8_800], ids=["one generation", "grown"])
def test_a_full_shards_answers_from_a_transaction_whose_exec_reply_is_lost_are_new(
    redis_server: RedisServer, filled: int
) -> None:
    """A shard full to its limit answers what it holds in a transaction; its EXEC reply lost.

    Nothing is confirmed then: every element of the call answers "new" (ambiguous), none
    is taken for seen, and the new ones are added all the same. (One generation: the
    snapshot answers; grown, near the next boundary: the stack.)
    """
    held, new = fingerprints(filled, "held"), fingerprints(100, "new")
    with ReplyCutter(redis_server.port, lambda command, _: command[0] == b"EXEC", 1) as cutter:
        client = redis.Redis(host="127.0.0.1", port=cutter.port)
        bloom = make(client, GROWN, f"cut{filled}", faults=FaultPolicy(retry_timeout=5))
        bloom.add_many(held)
        cutter.armed = True
        answers = bloom.add_many(held[:600] + new)
        cutter.armed = False
        assert len(cutter.cuts) == 1
        assert answers[600:] == [False] * len(new)
        assert bloom.events.counts["ambiguous"] > 0
        assert bloom.contains_many(held + new) == [True] * (len(held) + len(new))
        client.close()

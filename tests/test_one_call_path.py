"""One call path: bulk and snapshots talk to Redis through the executor, which sorts every reply.

Against a real redis-server: a snapshot whose connection is dropped (``CLIENT KILL``)
between its read and its write-back never writes its copy on a new connection, so the
bits another client set meanwhile survive and no new element is answered "seen"; an
``EXEC`` reply that is not the transaction's own is a doubt, answered "new"; and no
module outside ``transport/`` sends or reads on a node itself (an AST scan).
"""

from __future__ import annotations

import ast
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from test_bulk import FIXED, fingerprints, make, needs_numpy
from test_bulk_stacks import GROWN, grown

from scrapy_redis_bloom.engine.bitmap import snapshot, stacks
from scrapy_redis_bloom.transport import node as node_module
from scrapy_redis_bloom.transport.executor import Commit, Session, settled
from scrapy_redis_bloom.transport.wire import pack_command

PACKAGE = Path(__file__).resolve().parent.parent / "scrapy_redis_bloom"


def _dropped_meanwhile(
    monkeypatch: pytest.MonkeyPatch, client: redis.Redis, other: Any, outsider: str, kind: str
) -> list[int]:
    """Drop a snapshot's connection between its read and its write-back, once.

    Another client adds ``outsider``, the filter's connection is killed, and it sits
    idle long enough for the node to find it closed (where it used to reconnect
    silently). Returns the clients killed.
    """
    killed: list[int] = []

    def meanwhile() -> None:
        if not killed:
            assert other.check_and_add(outsider) is False
            killed.append(client.client_kill_filter(_type="normal", skipme=True))
            time.sleep(node_module.IDLE_CHECK + 0.3)

    if kind == "snapshot":
        kernel = snapshot.check_vectorised

        def hooked_kernel(buffer: bytearray, offsets: Any, write: bool) -> Any:
            meanwhile()
            return kernel(buffer, offsets, write)

        monkeypatch.setattr(snapshot, "check_vectorised", hooked_kernel)
    else:
        copy = stacks._copy

        def hooked_copy(*args: Any) -> Any:
            meanwhile()
            return copy(*args)

        monkeypatch.setattr(stacks, "_copy", hooked_copy)
    return killed


@needs_numpy
@pytest.mark.parametrize("kind", ["snapshot", "stack"])
def test_a_snapshot_whose_connection_dropped_before_its_write_back_writes_nothing(
    kind: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = f"dropped-{kind}"
    settings = FIXED if kind == "snapshot" else GROWN
    if kind == "snapshot":  # three small shards, read whole in one transaction
        bloom = make(redis_client, settings, key)
        held = fingerprints(600, "held")
        assert bloom.add_many(held) == [False] * len(held)
    else:  # a grown filter: a stack of generations per shard
        bloom = grown(redis_client, key)
        held = fingerprints(12_000, "held")
    other = make(redis_client, settings, key)
    new = fingerprints(600, "new")
    false_positives = bloom.contains_many(new)  # (a grown filter at 1e-3 has a few)
    assert false_positives.count(True) <= 6
    outsider = "added-by-another-worker-meanwhile"
    killed = _dropped_meanwhile(monkeypatch, redis_client, other, outsider, kind)
    answers = bloom.add_many(held + new)
    assert killed
    assert killed[0] >= 1
    # Nothing was written on a new connection: no new element found its own bits.
    assert answers[len(held) :] == false_positives
    # Nothing was sent after the drop, so nothing is in doubt either.
    assert answers[: len(held)] == [True] * len(held)
    assert bloom.events.counts["ambiguous"] == 0
    # The other worker's bits were not overwritten by the snapshot's old copy.
    monkeypatch.undo()
    assert make(redis_client, settings, key).contains_many([outsider]) == [True]
    assert bloom.contains_many(held + new) == [True] * (len(held) + len(new))
    other.close()


@needs_numpy
def test_writes_that_ran_outside_the_transaction_are_a_doubt(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    bloom = make(redis_client, FIXED, "outside")
    held = fingerprints(600, "held")
    assert bloom.add_many(held) == [False] * len(held)
    propose = Session.propose  # (what a transaction's writes are sent by)
    discarded: list[Any] = []

    def discarding_first(self: Session, payload: Any, queued: int) -> Any:
        # The transaction is closed before its writes: they run at once, and EXEC
        # answers "EXEC without MULTI", which is no reply of this transaction.
        discarded.append(self.round(pack_command(b"DISCARD"), 1)[0])
        return propose(self, payload, queued)

    monkeypatch.setattr(Session, "propose", discarding_first)
    new = fingerprints(600, "new")
    answers = bloom.add_many(held + new)
    assert discarded == [b"OK"]
    # Every bit the re-run found may be this call's own: all "new".
    assert answers == [False] * (len(held) + len(new))
    assert bloom.events.counts["ambiguous"] >= len(held)
    monkeypatch.undo()
    assert bloom.contains_many(held + new) == [True] * (len(held) + len(new))


def test_an_exec_reply_is_sorted_by_what_it_can_be_matched_to(redis_client: redis.Redis) -> None:
    bloom = make(redis_client, FIXED, "sorted")
    executor = bloom.executor
    node = executor.topology.route("k", None, None)

    def session(opening: list[bytes]) -> Session:
        one = executor.session(node)
        assert all(not isinstance(r, Exception) for r in one.round(b"".join(opening), len(opening)))
        return one

    def commit(one: Session, payload: list[bytes]) -> tuple[Commit, Any]:
        return one.settle(one.propose(payload, 1), 1)

    watch, multi, exec_ = pack_command(b"WATCH", "k"), pack_command(b"MULTI"), pack_command(b"EXEC")
    set_k = pack_command(b"SET", "k", "mine")
    # Its writes' results: done.
    outcome, results = commit(session([watch, multi]), [set_k, exec_])
    assert outcome is Commit.DONE
    assert results == [b"OK"]
    # A watched key written by another client meanwhile: nothing ran.
    one = session([watch, multi])
    redis_client.set("k", "theirs")
    assert commit(one, [set_k, exec_]) == (Commit.ABORTED, None)
    assert redis_client.get("k") == b"theirs"
    # A queued command refused (wrong arity): EXECABORT, nothing ran.
    outcome, refused = commit(session([multi]), [pack_command(b"SETRANGE", "k"), exec_])
    assert outcome is Commit.REFUSED
    assert "wrong number of arguments" in str(refused)
    # No MULTI on this connection: the write ran at once and EXEC says so. A doubt.
    outcome, _ = commit(session([watch]), [set_k, exec_])
    assert outcome is Commit.DOUBT
    assert redis_client.get("k") == b"mine"
    # More results than this transaction queued: commands of someone else's. A doubt.
    outcome, _ = commit(session([multi, set_k]), [set_k, exec_])
    assert outcome is Commit.DOUBT
    # A result in error: ran in part. A doubt.
    outcome, _ = commit(session([multi]), [pack_command(b"INCR", "k"), exec_])
    assert outcome is Commit.DOUBT
    bloom.close()


def test_settled_trusts_only_replies_it_can_match() -> None:
    assert settled([b"QUEUED", [1]], 1) == (Commit.DONE, [1])
    assert settled([b"QUEUED", None], 1) == (Commit.ABORTED, None)
    assert settled([1, [1]], 1)[0] is Commit.DOUBT  # ran at once
    assert settled([b"QUEUED", [1, 1]], 1)[0] is Commit.DOUBT  # another length
    assert settled([b"QUEUED", b"OK"], 1)[0] is Commit.DOUBT  # not a result list


def test_a_session_never_sends_on_a_new_connection(redis_client: redis.Redis) -> None:
    bloom = make(redis_client, FIXED, "pinned")
    node = bloom.executor.topology.route("k", None, None)
    one = bloom.executor.session(node)
    assert one.round(pack_command(b"WATCH", "k"), 1) == [b"OK"]
    node.abandon()  # the connection the session began on is gone
    with pytest.raises(node_module.NotSentError):
        one.post(pack_command(b"SET", "k", "v"), 1)
    assert redis_client.get("k") is None
    # A new session may connect anew.
    assert bloom.executor.session(node).round(pack_command(b"SET", "k", "v"), 1) == [b"OK"]
    bloom.close()


# -- no module outside transport/ talks to a node itself ---------------------------------------

#: A node's I/O methods (:class:`.transport.node.Node`).
NODE_IO = {"send", "receive", "exchange", "call", "abandon", "owes"}
#: A node's private state: its connection and its serial.
NODE_PRIVATE = {"_connect", "_connection", "_serial", "_owed"}


def node_io(source: str) -> list[str]:
    """Return the node I/O a module's source does: calls of NODE_IO, uses of NODE_PRIVATE.

    ``self._owed`` is a class's own attribute, not a node's.
    """
    found = []
    for item in ast.walk(ast.parse(source)):
        if isinstance(item, ast.Call) and isinstance(item.func, ast.Attribute):
            if item.func.attr in NODE_IO:
                found.append(f"{item.lineno}: {ast.unparse(item.func)}")
        elif isinstance(item, ast.Attribute) and item.attr in NODE_PRIVATE:
            if ast.unparse(item.value) == "self":
                continue
            found.append(f"{item.lineno}: {ast.unparse(item)}")
    return found


def test_the_scan_finds_node_io() -> None:
    sample = "node.send(b'', 1)\nx = self.node.receive(t)\nnode._connection.close()\n"
    assert node_io(sample) == ["1: node.send", "2: self.node.receive", "3: node._connection"]
    innocent = "self.executor.fast('x', b'', 'k', 0, None)\nsession.post(b'', 1)\nself._owed\n"
    assert node_io(innocent) == []


def test_no_module_outside_transport_sends_or_reads_on_a_node() -> None:
    outside = [p for p in sorted(PACKAGE.rglob("*.py")) if "transport" not in p.parts]
    assert any(p.name == "snapshot.py" for p in outside)
    found = {str(p.relative_to(PACKAGE)): hits for p in outside if (hits := node_io(p.read_text()))}
    assert found == {}

"""The bulk path's snapshot of a shard: read its bytes, answer in Python, write back at once.

For a batch with many elements in one shard, ``BITFIELD`` costs Redis ~0.25 µs per
bit (~3.5 µs per element at k = 13). The snapshot moves that work out of Redis, in two
round trips on the shard's node:

1. ``WATCH key``, ``GETRANGE`` of each MiB, ``MULTI``: the shard's bytes (at most 8
   MiB and its header: one copy is held at a time; a check without adds sends one
   ``GET``), checked against the identity, and for a
   growing shard its state: one generation, and room below
   :attr:`.generations.Growth.scriptless_limit` for the batch, or for its first
   elements (the script decides growth for the others);
2. the answers computed on a copy (:mod:`.local`), then ``SETRANGE key <low> <the
   changed bytes>``, for a growing shard ``SETRANGE`` of its count (the u32 at bit
   224) plus the new elements, and ``EXEC`` (empty when nothing changed).

``EXEC`` runs only if nobody wrote to the shard since ``WATCH`` (another worker, the
hot path, growth, a recovery): the batch then took effect as one atomic step, exactly
as check-and-add on each element in order would have. ``MULTI`` is confirmed before
any write is sent, so the writes never run outside the transaction.

In every other case the batch is handed back (:attr:`Taken.answers` is None) to the
``BITFIELD`` or script path, which deals with redirections, retries, lost shards and
their recovery: an aborted ``EXEC``, a shard that is not as expected, an error reply,
a failed connection. When ``EXEC`` may have run but its reply was lost, the batch is
handed back as ``ambiguous``: the bits may be its own, so "seen" answers become "new".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from scrapy_redis_bloom.core.generations import COUNT_BIT, GENERATIONS_BIT
from scrapy_redis_bloom.engine.bitmap.local import check_sequential, check_vectorised
from scrapy_redis_bloom.transport.executor import acl_denial
from scrapy_redis_bloom.transport.node import Node, NotSentError, TransportError
from scrapy_redis_bloom.transport.wire import command_head, encode, pack_command

logger = logging.getLogger(__name__)

#: Bytes a GETRANGE reads at most: a shard of 8 MiB is read in 8 commands of ~0.2 ms of
#: Redis time each, so other clients do not wait for one long GET.
PIECE = 1 << 20
_GENERATIONS = slice(GENERATIONS_BIT // 8, GENERATIONS_BIT // 8 + 2)
_COUNT = slice(COUNT_BIT // 8, COUNT_BIT // 8 + 4)


@dataclass(slots=True)
class Taken:
    """What a snapshot did: the answers, or why the batch goes back to the other path."""

    #: Per element, True when seen; None: not answered, run it through the other path.
    #: Fewer than the batch's elements: the first ones; the rest go through the other path.
    answers: list[bool] | None = None
    #: The writes may have run (a lost reply): the other path's "seen" answers become "new".
    ambiguous: bool = False
    #: A Redis ACL refused a command ("command" or "key"): do not try snapshots again.
    denied: str | None = None


def take(
    node: Node,
    key: str,
    identity: bytes,
    offsets: Any,
    write: bool,
    length: int,
    limit: int | None,
) -> Taken:
    """Check (and with ``write``, add) a batch of one shard through a snapshot of it.

    ``offsets``: the (n, k) bit offsets of the batch (:func:`.local.offsets_many`), or
    n lists of k (answered by :func:`.local.check_sequential`, without numpy);
    ``length``: the bytes the shard's string must have; ``limit``: for a growing shard,
    the scriptless limit its count plus the elements added must stay under (None:
    fixed); the batch's first elements up to it are answered, the rest are not.
    """
    packed = encode(key)
    # A check reads the shard in one GET: one atomic read. An add may read it in pieces:
    # its EXEC (even an empty one) confirms that nothing changed since WATCH.
    reads = [pack_command(b"GET", packed)]
    if write:
        reads = [
            pack_command(b"WATCH", packed),
            *(
                pack_command(b"GETRANGE", packed, start, min(start + PIECE, length) - 1)
                for start in range(0, length, PIECE)
            ),
            pack_command(b"MULTI"),
        ]
    try:
        replies = node.exchange(b"".join(reads), len(reads))
    except TransportError:
        return Taken()  # nothing was written: the other path retries
    try:
        return _answer(node, packed, identity, offsets, write, length, limit, replies)
    except TransportError:
        return Taken()
    except BaseException:
        node.abandon()  # a transaction may be open on it: never reuse the connection
        raise


def _answer(
    node: Node,
    key: bytes,
    identity: bytes,
    offsets: Any,
    write: bool,
    length: int,
    limit: int | None,
    replies: list[Any],
) -> Taken:
    failed = next((r for r in replies if isinstance(r, BaseException)), None)
    if failed is not None:
        _end(node, write, replies)
        return Taken(denied=acl_denial(failed))
    pieces = replies[1:-1] if write else replies
    # (A missing key: GET replies None, GETRANGE an empty string.)
    copy = bytearray().join(p for p in pieces if isinstance(p, bytes))
    if len(copy) != length or not copy.startswith(identity):
        _end(node, write, replies)  # lost, foreign or odd: the other path finds out which
        return Taken()
    count = 0
    if limit is not None:
        generations = int.from_bytes(copy[_GENERATIONS], "big")
        count = int.from_bytes(copy[_COUNT], "big")
        # A check reads generation 0 alone only while it is the one generation; an add
        # must also leave the growth boundary to the script: the snapshot takes the
        # elements the shard has room for below the limit, the script the rest.
        room = limit - 1 - count if write else len(offsets)
        if generations > 1 or room <= 0:
            _end(node, write, replies)
            return Taken()  # grown, or full to the limit: the script's
        offsets = offsets[:room]
    del pieces, replies[:]
    kernel = check_sequential if isinstance(offsets, list) else check_vectorised
    answers, low, high = kernel(copy, offsets, write)
    if not write:
        return Taken(answers)
    # The changed bytes go out copied once (a shard's are MiBs: each copy of them costs
    # about as much as sending them).
    commands: list[bytes | memoryview] = []
    sent = 1  # EXEC
    if low < high:  # else every element was seen: an empty EXEC confirms the read
        commands += (
            command_head(4, b"SETRANGE", key, low) + b"$%d\r\n" % (high - low),
            memoryview(copy)[low:high],
            b"\r\n",
        )
        sent += 1
    if limit is not None and low < high:
        sent += 1
        count += answers.count(False)
        commands.append(pack_command(b"SETRANGE", key, _COUNT.start, count.to_bytes(4, "big")))
    commands.append(pack_command(b"EXEC"))
    try:
        done = node.exchange(b"".join(commands), sent)
    except NotSentError:
        return Taken()
    except TransportError:
        return Taken(ambiguous=True)
    outcome = done[-1]
    if outcome is None:  # another client wrote to the shard: EXEC did nothing
        logger.debug("Snapshot of %r: the shard changed meanwhile, falling back", key)
        return Taken()
    if isinstance(outcome, BaseException):  # EXECABORT: a queued command was refused
        refused = next((r for r in done if isinstance(r, BaseException)), outcome)
        return Taken(denied=acl_denial(refused))
    if any(isinstance(r, BaseException) for r in outcome):  # ran in part: in doubt
        return Taken(ambiguous=True)
    return Taken(answers)


def _end(node: Node, write: bool, opening: list[Any]) -> None:
    """Close what the opening left open: the transaction (which unwatches), or the watch."""
    if write:  # WATCH, GETRANGE..., MULTI
        started = not isinstance(opening[-1], BaseException)
        node.exchange(pack_command(b"DISCARD" if started else b"UNWATCH"), 1)

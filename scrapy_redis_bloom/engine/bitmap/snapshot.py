"""The bulk path's snapshot of a shard: read its bytes, answer in Python, write back at once.

For a batch with many elements in one shard, ``BITFIELD`` costs Redis ~0.25 µs per
bit (~3.5 µs per element at k = 13). The snapshot moves that work out of Redis, in two
round trips on the shard's node:

1. ``WATCH key``, ``GET`` (or for a shard over 1 MiB ``GETRANGE`` of each MiB),
   ``MULTI``: the shard's bytes (a check without adds sends one ``GET``), checked
   against the identity, and for a
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

A blocked shard's batch may instead read only its blocks. Several shards of a node go
in the same two round trips and one transaction (:func:`take`); the caller bounds the
bytes one call holds.

Both round trips go through an executor :class:`~..transport.executor.Session`: the
second on the first one's connection or not at all, so the writes never run outside
the transaction (a dropped connection is not silently replaced by a new one).

In every other case the batch is handed back (:attr:`Taken.answers` is None) to the
``BITFIELD`` or script path, which deals with redirections, retries, lost shards and
their recovery: an aborted ``EXEC``, a shard that is not as expected, an error reply,
a failed connection. When ``EXEC`` may have run but its reply was lost, or the replies
are not the transaction's (:func:`.executor.settled`), the batch is handed back as
``ambiguous``: the bits may be its own, so "seen" answers become "new".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.utils import HIREDIS_AVAILABLE

from scrapy_redis_bloom.core.generations import COUNT_BIT, GENERATIONS_BIT
from scrapy_redis_bloom.core.layout import HEADER_BYTES
from scrapy_redis_bloom.engine.bitmap.local import (
    BLOCK_BYTES,
    HAVE_NUMPY,
    changed_slots,
    check_masks,
    check_sequential,
    check_vectorised,
    gather,
    is_masks,
    packed_runs,
    range_reads,
    range_writes,
    slot_bytes,
)
from scrapy_redis_bloom.engine.scripts import READ_BLOCKS, WRITE_BLOCKS
from scrapy_redis_bloom.transport.executor import Commit, Session, acl_denial
from scrapy_redis_bloom.transport.node import Ticket, TransportError
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
    #: (Several shards together) Another client wrote to one of the shards: nothing was
    #: written; each shard may be tried again on its own.
    aborted: bool = False


def _kernel(offsets: Any) -> Callable[[bytearray, Any, bool], tuple[list[bool], int, int]]:
    """Return the kernel for a batch's offsets: numpy's, or Python's (lists or masks)."""
    if is_masks(offsets):
        return check_masks
    return check_sequential if isinstance(offsets, list) else check_vectorised


def _end(session: Session, write: bool, opening: list[Any]) -> None:
    """Close what the opening left open: the transaction (which unwatches), or the watch."""
    if write:  # WATCH, GETRANGE..., MULTI
        started = not isinstance(opening[-1], BaseException)
        session.round(pack_command(b"DISCARD" if started else b"UNWATCH"), 1)


@dataclass(slots=True)
class Target:
    """One shard (one key) a :func:`take` reads and answers: key, identity, offsets, length.

    A shard read by its blocks must be blocked; one read ``whole`` may be of either layout.
    """

    key: str
    identity: bytes
    #: As :func:`take`'s ``offsets``.
    offsets: Any
    #: Bytes the shard's string must have.
    length: int
    #: Read every block (a small shard with many of the batch's elements), not only
    #: those the batch touches; its changed span is written back as :func:`take` does.
    whole: bool = False
    #: Filled by take: the blocks read (by blocks), the offsets in the copy read, and
    #: the replies its read takes (a whole shard read in pieces: one per piece).
    blocks: Any = field(default_factory=list)
    moved: Any = None
    replies: int = 1
    #: Read and written by ``GETRANGE`` and ``SETRANGE`` per run of blocks (packed by
    #: numpy), not by the block scripts (see :func:`_reads`); its reads, packed, and
    #: their number.
    ranged: bool = False
    runs: tuple[bytes, int] = (b"", 0)
    #: Read (and written) by the block scripts even with numpy: one reply for all its
    #: blocks, which redis-py without hiredis parses at a fraction of one per run.
    by_script: bool = False


#: ``SCRIPT LOAD`` of the two scripts that read and write a shard's blocks.
_LOAD_SCRIPTS = tuple(
    pack_command(b"SCRIPT", b"LOAD", script.source) for script in (READ_BLOCKS, WRITE_BLOCKS)
)
_MULTI = pack_command(b"MULTI")
_EXEC = pack_command(b"EXEC")
#: Whether the read script joins the blocks into one string: for redis-py without
#: hiredis, which parses each string of a reply in Python (~0.5 µs each: ~5 ms per
#: call of 10,000 at 100M), not with it (joining costs Redis ~0.1 µs a block).
_JOINED = b"0" if HIREDIS_AVAILABLE else b"1"
#: Whether a block-read shard is read and written by plain ``GETRANGE`` and
#: ``SETRANGE`` per run of blocks, packed by numpy (:func:`.local.range_commands`):
#: at 100M, ~0.55 and ~0.65 µs of Redis time a block, against ~1.3 and ~1.1 in the
#: scripts, whose ``redis.call`` per block and argument strings cost Redis more than
#: the commands' own parsing (``bench/floor.py``). Without numpy the scripts stay:
#: Python packs ~1.4 µs per command, and (without hiredis) parses each reply in Python.
_BY_RANGES = HAVE_NUMPY
#: Blocks one GETRANGE or SETRANGE moves at most (1 MiB, as :data:`PIECE`).
RUN_BLOCKS = PIECE // BLOCK_BYTES


def take(
    session: Session, targets: Sequence[Target], write: bool, limit: int | None
) -> list[Taken]:
    """Check (and add) batches of shards on one node together, blocked ones by their blocks.

    A blocked filter's element has all its bits in one 64-byte block, so a batch of a
    few hundred elements in an 8 MiB shard needs a few hundred blocks, not the shard.
    ``WATCH`` the keys, then per shard its length (``STRLEN``), its header and each run
    of neighbouring blocks the batch touches (``GETRANGE``), ``MULTI``; the answers
    computed on that compact copy (:func:`.local.gather`); then a ``SETRANGE`` of each
    block changed and of a growing shard's count, and ``EXEC``: two round trips for the
    shards given, about 1.3 µs of Redis time per element at 100M (the commands packed
    by numpy, :func:`.local.range_commands`). A check without adds reads each shard in
    a ``MULTI``/``EXEC`` of its own: atomically. Without numpy, a script reads each
    shard (``lua/read_blocks.lua``: one reply) and one writes it back
    (``lua/write_blocks.lua``): ~2.4 µs of Redis time per element (1.3 to read a block
    in Lua, 1.1 to write it), but a reply per shard, not per block, which Python
    without numpy (and redis-py without hiredis) pays more for than Redis saves.

    A target marked ``whole`` (a small shard, at most :data:`PIECE`, with many of the
    batch's elements: a 1M filter's shards of 96 to 160 KB, of either layout) is read by
    ``GET`` and its changed span written back by ``SETRANGE``, in the same two round
    trips as the node's other shards. Not through Lua: a script's argument or result of
    that size costs Redis ~1 ns a byte to copy and collect (measured: ~100 µs for 96
    KB, against 1.5 µs for a ``GETRANGE`` of it).

    Each shard's read is sent as soon as it is packed, and answered as soon as its
    reply is in: Python works on one shard while Redis reads the next (the first
    round trip is then about the longer of the two, not their sum).

    ``session``: the executor's session on their node. ``targets`` must be shards one
    transaction may name together (one slot in a cluster).
    One :class:`Taken` per target, in order. When another client wrote to any of the
    shards, nothing was written and every target is ``aborted``: the caller may try each
    shard on its own.
    """
    pending = begin(session, targets, write, limit)
    answer(pending)
    return finish(pending)


@dataclass(slots=True, eq=False)
class Pending:
    """A :func:`take` in progress: its reads sent (:func:`begin`), then its writes (:func:`answer`).

    Between the phases the caller may work on another node's, or another connection's,
    take: its replies wait on this one's connection, in order.
    """

    session: Session
    targets: Sequence[Target]
    write: bool
    limit: int | None
    keys: list[bytes]
    #: The opening's commands sent (SCRIPT LOADs, WATCH), and the reads' tickets.
    opening: int = 0
    reads: list[tuple[Ticket, list[int]]] = field(default_factory=list)
    #: Set by :func:`answer`: what each target's snapshot did so far, and what its EXEC's
    #: replies decide (:func:`_written`); or the outcome, when nothing is owed.
    taken: list[Taken] | None = None
    sent: Any = None
    queued: int = 0
    done: list[Taken] | None = None


def begin(session: Session, targets: Sequence[Target], write: bool, limit: int | None) -> Pending:
    """Send :func:`take`'s first round (its reads and ``MULTI``); :func:`answer` reads it."""
    packed = [encode(target.key) for target in targets]
    pending = Pending(session, targets, write, limit, packed)
    _gather(targets, packed)
    # The scripts by EVALSHA, loaded first in the same trip (a few µs; a restarted Redis
    # has none): a least-privilege user has EVALSHA and SCRIPT LOAD, not EVAL.
    scripted = any(not target.whole and not target.ranged for target in targets)
    opening = [*_LOAD_SCRIPTS] if scripted else []
    if write:
        opening.append(pack_command(b"WATCH", *packed))
    pending.opening = len(opening)
    groups = _groups(targets)
    try:
        for n, group in enumerate(groups):
            commands = [c for i in group for c in _reads(targets[i], packed[i], write)]
            count = sum(targets[i].replies for i in group)
            if n == 0:
                commands[:0] = opening
                count += len(opening)
            if write and n == len(groups) - 1:
                commands.append(_MULTI)
                count += 1
            pending.reads.append((session.post(b"".join(commands), count), group))
    except TransportError:
        session.drop()  # replies may be owed on it: never read them later
        pending.done = [Taken() for _ in targets]  # nothing was written: the other path retries
    return pending


def answer(pending: Pending) -> None:
    """Read a :func:`begin`'s replies, answer its targets and send their writes and ``EXEC``.

    The writes go once ``MULTI`` is confirmed; their replies are :func:`finish`'s to read.
    """
    if pending.done is not None:
        return
    session, targets, write, limit = pending.session, pending.targets, pending.write, pending.limit
    try:
        replies: list[Any] = []  # the opening's, then MULTI's
        failed: BaseException | None = None
        found: list[_Copy | None] = [None] * len(targets)
        for n, (ticket, group) in enumerate(pending.reads):
            read = session.replies(ticket)
            failed = failed or _failure(read)
            if n == 0:
                replies, read = read[: pending.opening], read[pending.opening :]
            if write and n == len(pending.reads) - 1:
                replies.append(read.pop())
            for i in group:
                mine, read = read[: targets[i].replies], read[targets[i].replies :]
                found[i] = None if failed else _check(targets[i], mine, write, limit)
        if failed is None:
            _send_writes(pending, found, replies)
            return
        if write:
            _end(session, write, replies)
        pending.done = [Taken(denied=acl_denial(failed)) for _ in targets]
    except TransportError:
        pending.done = [Taken() for _ in targets]
    except BaseException:
        session.drop()  # a transaction may be open on it: never reuse the connection
        raise


def finish(pending: Pending) -> list[Taken]:
    """Read the ``EXEC`` :func:`answer` sent; return what each target's snapshot did."""
    if pending.done is None:
        assert pending.taken is not None
        outcome = pending.session.settle(pending.sent, pending.queued)
        pending.done = _written(pending.targets, pending.taken, outcome)
    return pending.done


def _gather(targets: Sequence[Target], keys: list[bytes]) -> None:
    """Find the blocks each target read by its blocks needs; pack the ranged targets' reads.

    The ranged targets' ``GETRANGE``s are packed all at once: numpy's cost is per
    operation (~120 µs a shard of a 100M filter when packed one by one).
    """
    for target in targets:
        target.ranged = (
            not target.whole
            and _BY_RANGES
            and not target.by_script
            and not isinstance(target.offsets, list)
        )
        if not target.whole:
            target.blocks, target.moved = gather(target.offsets)
    ranged = [i for i, target in enumerate(targets) if target.ranged]
    if ranged:
        packed = range_reads(
            [keys[i] for i in ranged], [targets[i].blocks for i in ranged], RUN_BLOCKS
        )
        for i, runs in zip(ranged, packed, strict=True):
            targets[i].runs = runs


def _groups(targets: Sequence[Target]) -> list[list[int]]:
    """Group the targets (by position) whose reads go together: the whole ones, then one each.

    A target read by its blocks costs Redis ~1.3 µs an element (a few hundred µs for a
    100M filter's shard), about what answering it costs Python: sent on its own, it is
    answered while Redis reads the next (+10% at 100M in calls of 10,000). A whole
    target's read costs Redis little: sent apart, the 31 shards of a 1M filter paid more
    in round trips than they gained (-5 to -30%), so the whole targets go together.
    """
    whole = [i for i, target in enumerate(targets) if target.whole]
    return ([whole] if whole else []) + [
        [i] for i, target in enumerate(targets) if not target.whole
    ]


def _coalesced(pieces: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    """Join the small pieces of a payload; leave the big ones (views of a copy) as they are.

    A 1M filter's call writes back ~4 MB of shard bytes: joined, they were copied once
    more (~10% of a call of 100,000); sent as views, a send each.
    """
    out: list[bytes | memoryview] = []
    small: list[bytes | memoryview] = []
    for piece in pieces:
        if len(piece) < _BIG:
            small.append(piece)
            continue
        if small:
            out.append(b"".join(small))
            small = []
        out.append(piece)
    if small:
        out.append(b"".join(small))
    return out


#: A piece of a payload at least this big is sent as it is (:func:`_coalesced`).
_BIG = 1 << 16


def _failure(replies: list[Any]) -> BaseException | None:
    """Return the first error reply among ``replies``, if any."""
    return next((r for r in replies if isinstance(r, BaseException)), None)


def _reads(target: Target, key: bytes, write: bool) -> list[bytes]:
    """Pack the commands that read a target: ``GET``, 1 MiB ``GETRANGE``s, or its blocks."""
    if target.whole:  # not through Lua: it would copy and collect the bytes (~1 ns each)
        target.moved = target.offsets
        # A check reads the shard in one GET: one atomic read. An add may read it in
        # pieces: its EXEC (even an empty one) confirms nothing changed since WATCH.
        if not write or target.length <= PIECE:
            target.replies = 1
            return [pack_command(b"GET", key)]
        ranges = range(0, target.length, PIECE)
        target.replies = len(ranges)
        return [
            pack_command(b"GETRANGE", key, start, min(start + PIECE, target.length) - 1)
            for start in ranges
        ]
    if target.ranged:  # STRLEN, the header, then a GETRANGE per run of blocks
        reads, count = target.runs
        commands = [
            pack_command(b"STRLEN", key),
            pack_command(b"GETRANGE", key, 0, HEADER_BYTES - 1),
            reads,
        ]
        target.replies = 2 + count
        if write:  # under WATCH: EXEC confirms nothing changed since
            return commands
        # A check reads the shard atomically, as the script does: in one transaction.
        target.replies += 2
        return [_MULTI, *commands, _EXEC]
    target.replies = 1
    spans = packed_runs(target.blocks, range(len(target.blocks)), RUN_BLOCKS)
    return [pack_command(b"EVALSHA", READ_BLOCKS.sha, 1, key, spans, _JOINED)]


#: What :func:`_check` gives a target it answered: its copy after the kernel, the bytes
#: read (a target by blocks: to find the blocks changed), its count, and the kernel's
#: answers and changed span.
_Copy = tuple[bytearray, bytes, int, tuple[list[bool], int, int]]


def _check(target: Target, read: list[Any], write: bool, limit: int | None) -> _Copy | None:
    """Check a target's read and answer its batch on a copy; None to hand it back.

    A target is handed back when its shard is lost, foreign or not as expected, or, for
    a growing shard, grown or full to the limit.
    """
    got = _copy(target, read, write)
    if got is None:
        return None
    copy, before = got
    moved, count = target.moved, 0
    if limit is not None:
        generations = int.from_bytes(copy[_GENERATIONS], "big")
        count = int.from_bytes(copy[_COUNT], "big")
        # A check reads generation 0 alone only while it is the one generation; an
        # add must also leave the growth boundary to the script: the snapshot takes
        # the elements the shard has room for below the limit, the script the rest.
        room = limit - 1 - count if write else len(moved)
        if generations > 1 or room <= 0:
            return None  # grown, or full to the limit: the script's
        moved = moved[:room]
    return copy, before, count, _kernel(moved)(copy, moved, write)


def _copy(target: Target, read: list[Any], write: bool) -> tuple[bytearray, bytes] | None:
    """Return a target's copy as read (compact when by blocks) and the bytes read; None if odd.

    None when the key is lost, foreign or not as expected (its length, its identity).
    """
    if target.whole:  # GET's reply or GETRANGE's pieces (a missing key: None, or b"")
        copy = bytearray().join(p for p in read if isinstance(p, bytes))
        del read[:]  # (a shard's pieces are MiBs: let go once copied)
        strlen = size = len(copy)
        before = b""
    else:  # its length, the header, the runs of blocks: the read script's reply, or
        # the commands' replies (a check's: its EXEC's)
        inside = target.ranged and not write  # (errors elsewhere: found by take's _failure)
        reply = read[-1] if inside else read if target.ranged else read[0]
        if not isinstance(reply, list) or (inside and _failure(reply)):
            return None  # a command refused inside a check's transaction: the other path's
        strlen, before = reply[0], b"".join(reply[1:])
        copy, size = bytearray(before), HEADER_BYTES + len(target.blocks) * BLOCK_BYTES
    if strlen != target.length or not copy.startswith(target.identity) or len(copy) != size:
        return None  # lost, foreign or odd: the other path finds out which
    return copy, before


def _write_back(
    session: Session,
    keys: list[bytes],
    targets: Sequence[Target],
    write: bool,
    limit: int | None,
    found: list[_Copy | None],
    opening: list[Any],
    extra: Sequence[bytes] = (),
) -> list[Taken]:
    """Send what the answers changed and ``EXEC``; return what each target's snapshot did.

    ``extra``: more writes for the transaction (a grown shard's count, in another key).
    """
    pending = Pending(session, targets, write, limit, keys)
    _send_writes(pending, found, opening, extra)
    return finish(pending)


def _send_writes(
    pending: Pending, found: list[_Copy | None], opening: list[Any], extra: Sequence[bytes] = ()
) -> None:
    """Send what the answers changed and ``EXEC`` (not reading the replies: :func:`finish`).

    ``found``: per target, what :func:`_check` gave (None: handed back); ``opening``: the
    first round's replies (the opening's and MULTI's); ``extra``: as :func:`_write_back`'s.
    """
    session, targets, write, limit = pending.session, pending.targets, pending.write, pending.limit
    taken: list[Taken] = []
    commands: list[bytes | memoryview] = [*extra]
    changed: list[tuple[bytes, Any, bytes, bytearray]] = []  # ranged targets' blocks to write
    queued = len(extra)
    for target, key, got in zip(targets, pending.keys, found, strict=True):
        if got is None:
            taken.append(Taken())  # lost, foreign, odd, grown or full: the other path's
            continue
        copy, before, count, (answers, low, high) = got
        taken.append(Taken(answers))
        if not write or low >= high:
            continue
        queued += 0 if target.ranged else 1  # (a ranged target's commands are counted below)
        if target.whole:  # the span the kernel changed, its MiBs copied once (by the join)
            commands += (
                command_head(4, b"SETRANGE", key, low) + b"$%d\r\n" % (high - low),
                memoryview(copy)[low:high],
                b"\r\n",
            )
        elif target.ranged:  # a SETRANGE per block changed: all targets' at once, below
            changed.append((key, target.blocks, before, copy))
        else:
            slots = changed_slots(before, copy)
            spans = packed_runs(target.blocks, slots, RUN_BLOCKS)
            data = slot_bytes(copy, slots)
            commands.append(pack_command(b"EVALSHA", WRITE_BLOCKS.sha, 1, key, spans, data))
        if limit is not None:
            queued += 1
            count += answers.count(False)
            commands.append(pack_command(b"SETRANGE", key, _COUNT.start, count.to_bytes(4, "big")))
    if not write:
        pending.done = taken
        return
    if changed:
        writes, count = range_writes(*(list(column) for column in zip(*changed, strict=True)))
        commands.append(writes)
        queued += count
    if all(one.answers is None for one in taken):  # nothing to confirm: close it
        _end(session, write, opening)
        pending.done = taken
        return
    commands.append(_EXEC)
    pending.taken, pending.queued = taken, queued
    pending.sent = session.propose(_coalesced(commands), queued)


def _written(
    targets: Sequence[Target], taken: list[Taken], done: tuple[Commit, Any]
) -> list[Taken]:
    """Return what each target's snapshot did, from what its transaction's ``EXEC`` did."""
    outcome, reply = done
    if outcome is Commit.DONE:
        return taken
    if outcome is Commit.ABORTED:  # another client wrote to a shard: EXEC did nothing
        logger.debug("Snapshot of %d shard(s): one changed meanwhile", len(targets))
        return [Taken(aborted=True) for _ in targets]
    if outcome is Commit.REFUSED:  # nothing ran
        return [Taken(denied=acl_denial(reply)) for _ in targets]
    if outcome is Commit.UNSENT:  # nothing written: the other path's answers stand
        return [Taken() for _ in targets]
    return [Taken(ambiguous=t.answers is not None) for t in taken]  # may have run

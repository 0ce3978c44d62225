"""The bulk path's snapshot of a shard: read its bytes, answer in Python, write back at once.

``BITFIELD`` costs Redis time per bit; the snapshot moves that work out of Redis, in two
round trips on the shard's node:

1. ``WATCH key``, the reads (:func:`_reads`), ``MULTI``: the bytes, checked against the
   identity, and for a growing shard its state (one generation, and room below
   :attr:`.generations.Growth.scriptless_limit` for the batch or its first elements);
2. the answers computed on a copy (:mod:`.local`), then ``SETRANGE`` of the changed
   bytes (and of a growing shard's count), and ``EXEC``.

``EXEC`` runs only if nobody wrote to the shard since ``WATCH``: the batch took effect
as one atomic step, as check-and-add on each element in order would have. The second
round goes on the first one's connection (an executor
:class:`~..transport.executor.Session`) or not at all, after ``MULTI`` is confirmed, so
the writes never run outside the transaction. Several shards of a node share the two
round trips and one transaction (:func:`take`).

Otherwise (an aborted ``EXEC``, a shard not as expected, an error reply, a failed
connection) the batch is handed back (:attr:`Taken.answers` is None) to the ``BITFIELD``
or script path, which deals with redirections, retries and lost shards; ``ambiguous``
when ``EXEC`` may have run but its reply was lost: "seen" answers become "new".
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.utils import HIREDIS_AVAILABLE

from scrapy_redis_bloom.core.generations import COUNT_BIT, GENERATIONS_BIT
from scrapy_redis_bloom.core.layout import HEADER_BYTES
from scrapy_redis_bloom.engine.bitmap.local import (
    BLOCK_BYTES,
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
    within,
)
from scrapy_redis_bloom.engine.scripts import READ_BLOCKS, WRITE_BLOCKS
from scrapy_redis_bloom.transport.executor import Commit, Session, acl_denial
from scrapy_redis_bloom.transport.node import Ticket, TransportError
from scrapy_redis_bloom.transport.wire import command_head, encode, pack_command

logger = logging.getLogger(__name__)

#: Bytes a GETRANGE reads at most (~0.2 ms of Redis time: others do not wait long).
PIECE = 1 << 20
_GENERATIONS = GENERATIONS_BIT // 8
_COUNT = COUNT_BIT // 8


def _generations(head: bytes | bytearray) -> int:
    """Return a generation 0's generations (u16 of its state; 0 reads as 1)."""
    return max(int.from_bytes(head[_GENERATIONS:_COUNT], "big"), 1)


def _u32(head: bytes | bytearray) -> int:
    """Return a generation 0's newest generation's count (u32 of its state)."""
    return int.from_bytes(head[_COUNT : _COUNT + 4], "big")


@dataclass(slots=True)
class Taken:
    """What a snapshot did: the answers, or why the batch goes back to the other path."""

    #: Per element, True when seen (maybe only the first ones); None: the other path's.
    answers: list[bool] | None = None
    #: The writes may have run (a lost reply): the other path's "seen" answers become "new".
    ambiguous: bool = False
    #: A Redis ACL refused a command ("command" or "key"): do not try snapshots again.
    denied: str | None = None
    #: Another client wrote to one of several shards: nothing written; retry each alone.
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
    """One shard (one key) a :func:`take` reads and answers (``whole``: not by its blocks)."""

    key: str
    identity: bytes
    offsets: Any
    length: int
    whole: bool = False
    #: Filled by take: the blocks read, the offsets in the copy, the replies its read takes.
    blocks: Any = field(default_factory=list)
    moved: Any = None
    replies: int = 1
    #: Read and written per run of blocks by ``GETRANGE``/``SETRANGE`` (numpy); its reads.
    ranged: bool = False
    runs: tuple[bytes, int] = (b"", 0)
    #: By the block scripts even with numpy: one reply for all its blocks (no hiredis).
    by_script: bool = False


#: ``SCRIPT LOAD`` of the two scripts that read and write a shard's blocks.
_LOAD_SCRIPTS = tuple(
    pack_command(b"SCRIPT", b"LOAD", script.source) for script in (READ_BLOCKS, WRITE_BLOCKS)
)
_MULTI = pack_command(b"MULTI")
_EXEC = pack_command(b"EXEC")
#: Whether the read script joins the blocks (redis-py without hiredis parses slowly).
_JOINED = b"0" if HIREDIS_AVAILABLE else b"1"
#: Blocks one GETRANGE or SETRANGE moves at most (1 MiB, as :data:`PIECE`).
RUN_BLOCKS = PIECE // BLOCK_BYTES
#: A piece of a payload at least this big is sent as it is (:func:`_coalesced`).
_BIG = 1 << 16


def take(
    session: Session, targets: Sequence[Target], write: bool, limit: int | None
) -> list[Taken]:
    """Check (and add) batches of shards on one node together; a :class:`Taken` per target."""
    pending = begin(session, targets, write, limit)
    answer(pending)
    return finish(pending)


@dataclass(slots=True, eq=False)
class Pending:
    """A :func:`take` in progress: reads sent (:func:`begin`), then writes (:func:`answer`)."""

    session: Session
    targets: Sequence[Target]
    write: bool
    limit: int | None
    keys: list[bytes]
    #: The opening's commands sent (SCRIPT LOADs, WATCH), and the reads' tickets.
    opening: int = 0
    reads: list[tuple[Ticket, list[int]]] = field(default_factory=list)
    #: Set by :func:`answer`: what each target did, the EXEC's ticket and queued; the outcome.
    taken: list[Taken] | None = None
    sent: Any = None
    queued: int = 0
    done: list[Taken] | None = None


def begin(session: Session, targets: Sequence[Target], write: bool, limit: int | None) -> Pending:
    """Send :func:`take`'s first round (its reads and ``MULTI``); :func:`answer` reads it."""
    packed = [encode(target.key) for target in targets]
    pending = Pending(session, targets, write, limit, packed)
    opening = _opening(targets, packed, packed if write else None)
    pending.opening = len(opening)
    # Whole targets' reads go together; one by blocks alone, answered as Redis reads the next.
    whole = [i for i, target in enumerate(targets) if target.whole]
    groups = [whole] if whole else []
    groups += [[i] for i, target in enumerate(targets) if not target.whole]
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
    """Read a :func:`begin`'s replies, answer its targets, send their writes and ``EXEC``."""
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


def _opening(
    targets: Sequence[Target], keys: list[bytes], watched: Sequence[bytes | str] | None
) -> list[bytes]:
    """Find what the targets read; return the opening commands (block scripts, ``WATCH``)."""
    for target in targets:
        if not target.whole:
            target.blocks, target.moved = gather(target.offsets)
            target.ranged = not target.by_script and not isinstance(target.offsets, list)
    ranged = [i for i, target in enumerate(targets) if target.ranged]
    if ranged:  # all at once: numpy's cost is per call
        packed = range_reads(
            [keys[i] for i in ranged], [targets[i].blocks for i in ranged], RUN_BLOCKS
        )
        for i, runs in zip(ranged, packed, strict=True):
            targets[i].runs = runs
    scripted = any(not target.whole and not target.ranged for target in targets)
    opening = [*_LOAD_SCRIPTS] if scripted else []
    if watched is not None:
        opening.append(pack_command(b"WATCH", *watched))
    return opening


def _coalesced(pieces: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    """Join a payload's small pieces, not its big ones (copying those costs time)."""
    out: list[bytes | memoryview] = []
    for big, run in itertools.groupby(pieces, lambda piece: len(piece) >= _BIG):
        together = list(run)
        out += together if big else [b"".join(together)]
    return out


def _failure(replies: list[Any]) -> BaseException | None:
    return next((r for r in replies if isinstance(r, BaseException)), None)


def _reads(target: Target, key: bytes, write: bool) -> list[bytes]:
    """Pack the commands that read a target: ``GET``, 1 MiB ``GETRANGE``s, or its blocks."""
    if target.whole:
        target.moved = target.offsets
        # A check reads it in one atomic GET; an add may read pieces, its EXEC confirms.
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


#: What :func:`_check` gives: the copy, the bytes read, the count, the kernel's result.
_Copy = tuple[bytearray, bytes, int, tuple[list[bool], int, int]]


def _check(target: Target, read: list[Any], write: bool, limit: int | None) -> _Copy | None:
    """Answer a target's batch on a copy of its read; None: lost, odd, grown or full (hand back)."""
    got = _copy(target, read, write)
    if got is None:
        return None
    copy, before = got
    moved, count = target.moved, 0
    if limit is not None:
        generations, count = _generations(copy), _u32(copy)
        # An add leaves the growth boundary to the script: it takes what the room allows.
        room = limit - 1 - count if write else len(moved)
        if generations > 1:
            return None  # grown: the stacks'
        if room < len(moved):  # up to the room's worth of elements it does not hold yet
            moved = moved[: within(_kernel(moved)(copy, moved, False)[0], room)]
            if not len(moved):
                return None  # full to the limit: the script's
    return copy, before, count, _kernel(moved)(copy, moved, write)


def _copy(target: Target, read: list[Any], write: bool) -> tuple[bytearray, bytes] | None:
    """Return a target's copy (compact when by blocks) and the bytes read; None if odd."""
    if target.whole:  # GET's reply or GETRANGE's pieces (a missing key: None, or b"")
        copy = bytearray().join(p for p in read if isinstance(p, bytes))
        del read[:]  # (a shard's pieces are MiBs: let go once copied)
        strlen = size = len(copy)
        before = b""
    else:  # its length, the header, the blocks: the script's reply, or the commands' (or EXEC's)
        inside = target.ranged and not write  # (errors elsewhere: found by take's _failure)
        reply = read[-1] if inside else read if target.ranged else read[0]
        if not isinstance(reply, list) or (inside and _failure(reply)):
            return None  # a command refused inside a check's transaction: the other path's
        try:
            strlen, before = reply[0], b"".join(reply[1:])  # (TypeError: not all strings)
        except TypeError:
            return None  # not these commands' replies: the other path reads again
        if strlen.__class__ is not int:
            return None
        copy, size = bytearray(before), HEADER_BYTES + len(target.blocks) * BLOCK_BYTES
    if strlen != target.length or not copy.startswith(target.identity) or len(copy) != size:
        return None  # lost, foreign or odd: the other path finds out which
    return copy, before


def _send_writes(
    pending: Pending, found: list[_Copy | None], opening: list[Any], extra: Sequence[bytes] = ()
) -> None:
    """Send what the answers changed (and ``extra`` writes) and ``EXEC``."""
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
            commands.append(pack_command(b"SETRANGE", key, _COUNT, count.to_bytes(4, "big")))
    if not write or all(one.answers is None for one in taken):  # nothing to confirm: close it
        _end(session, write, opening)
        pending.done = taken
        return
    if changed:
        writes, count = range_writes(*(list(column) for column in zip(*changed, strict=True)))
        commands.append(writes)
        queued += count
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

"""Bulk checks of grown and windowed shards: every key read, the newest written, atomically.

A grown shard keeps its bits in several generations; with re-crawl windows, in the
generations of two windows (:mod:`..generations`, :mod:`.stackpath`), and only the newest
generation of the current window takes adds. So a batch of a shard's elements is a
snapshot (:mod:`.snapshot`) over several keys of one slot, a *stack* (:class:`Stack`), in
two round trips after one round of :func:`probes` for all shards:

1. ``WATCH`` every key, (``TIME`` with windows; the anchor's header), each key's bytes
   (as :func:`.snapshot.take`), ``MULTI``: every key must carry the shard's identity and
   length, the headers' state as :func:`probe` found it.
2. "Seen" where an element is in an older key, else the newest generation's kernel on the
   others, in order; ``SETRANGE`` of its changed bytes and count, and ``EXEC``, which runs
   only if no key changed since ``WATCH``: one atomic step, as the script on each element.

A check watches and writes nothing: each key is read atomically with its header. The
script stays the authority at the boundaries: elements that would bring the newest
generation within the margin of its capacity go back to it (only the script starts a
generation), and so does a whole batch whose shard is not as found (lost, reset, foreign,
grown meanwhile) or whose window is not started or in its last :data:`GUARD` seconds.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scrapy_redis_bloom.core import layout
from scrapy_redis_bloom.core.generations import SCRIPTLESS_MARGIN, Growth, window_key
from scrapy_redis_bloom.core.layout import IDENTITY_BYTES
from scrapy_redis_bloom.engine.bitmap.local import HAVE_NUMPY, within
from scrapy_redis_bloom.engine.bitmap.snapshot import (
    _COUNT,
    _GENERATIONS,
    _MULTI,
    Pending,
    Taken,
    Target,
    _copy,
    _end,
    _failure,
    _generations,
    _kernel,
    _opening,
    _reads,
    _send_writes,
    _u32,
    finish,
)
from scrapy_redis_bloom.engine.bitmap.stackpath import _header
from scrapy_redis_bloom.engine.clock import GUARD, TIME
from scrapy_redis_bloom.transport.executor import Call, Session, acl_denial
from scrapy_redis_bloom.transport.node import TransportError
from scrapy_redis_bloom.transport.wire import encode, pack_command

if HAVE_NUMPY:
    import numpy as np


@dataclass(frozen=True, slots=True)
class Found:
    """What :func:`probe` read of a shard: the keys its batch reads, the state they must have."""

    keys: tuple[tuple[str, int], ...]
    state: str
    generations: int
    limit: int
    count: int  # (the newest generation's count and capacity, as probed)
    capacity: int
    before: tuple[str, int] | None = None
    anchor: str | None = None
    window: int = -1


@dataclass(slots=True)
class Stack:
    """One shard's batch in :func:`take_stacks`: what :func:`probe` found, a target per key."""

    identity: bytes
    found: Found
    targets: list[Target]  # (one per key of ``found.keys``)
    ttl: int = 0


def probes(key: str, shard: int, ttl: int, window: int) -> list[Call]:
    """Return the reads :func:`probe` takes for a shard (``window``: the current one, guessed)."""
    shard_key = layout.shard_key(key, shard)
    heads = [shard_key]
    if ttl:
        heads += [window_key(key, shard, window - 1, 0), window_key(key, shard, window, 0)]
    calls = [Call(_header(name), key=shard_key, shard=shard) for name in heads]
    if ttl:
        calls.insert(0, Call(TIME, key=shard_key, shard=shard))
    return calls


def probe(
    growth: Growth, key: str, shard: int, identity: bytes, replies: list[Any], window: int
) -> Found | None:
    """Read a shard's probe (:func:`probes`' replies); None: the script's (see the module doc)."""
    if any(not isinstance(reply, bytes | list) for reply in replies):
        return None
    ttl, most, head = growth.ttl, len(growth.generations), replies[-1]
    older: tuple[tuple[str, int], ...] = ()
    previous, anchor = None, None
    if ttl:
        now, first, before, _ = replies
        seconds = _seconds(now)
        if seconds is None or int(seconds) // ttl != window:
            return None
        if (window + 1) * ttl - seconds <= 2 * GUARD:
            return None  # its last seconds: the script starts the next window
        if not _anchored(first, identity, window, before == b""):
            return None  # not ours, or the current window not started: the script's
        if before != b"" and not (_ours(before, identity) and _generations(before) <= most):
            return None
        count = _generations(before) if before else 0  # (absent: none)
        older = tuple((window_key(key, shard, window - 1, g), g) for g in range(count))
        previous = (window_key(key, shard, window - 1, 0), count)
        anchor = layout.shard_key(key, shard)
    if not _ours(head, identity) or _generations(head) > most:
        return None
    generations = _generations(head)
    capacity = growth.generation(generations - 1).capacity  # (the newest's)
    if ttl:
        names = older + tuple((window_key(key, shard, window, g), g) for g in range(generations))
    else:
        names = tuple((layout.shard_key(key, shard, g), g) for g in range(generations))
    limit = capacity - max(SCRIPTLESS_MARGIN, capacity // 100)  # then its adds are the script's
    state = names[len(older)][0]  # (generation 0 of the current window)
    return Found(names, state, generations, limit, _u32(head), capacity, previous, anchor, window)


def _anchored(anchor: Any, identity: bytes, window: int, absent: bool) -> bool:
    """Tell whether an anchor is ours and of ``window`` (``absent``: the window before is)."""
    if not _ours(anchor, identity) or _u32(anchor) != window:
        return False
    # Absent now, but it existed when the current window started: lost, the script's.
    return not (absent and int.from_bytes(anchor[_GENERATIONS:_COUNT], "big"))


def take_stacks(session: Session, stacks: Sequence[Stack], write: bool) -> list[Taken]:
    """Check (and add) shards' batches on one node in one transaction; a :class:`.Taken` each."""
    targets = [target for stack in stacks for target in stack.targets]
    keys = [encode(target.key) for target in targets]
    watched = dict.fromkeys(name for stack in stacks for name in _watched(stack))
    commands = _opening(targets, keys, list(watched) if write else None)
    opening = len(commands)
    timed = any(stack.ttl for stack in stacks)
    if timed:
        commands.append(TIME)
    for stack in stacks:
        if stack.found.anchor is not None:
            commands.append(_header(stack.found.anchor))
        for target in stack.targets:
            commands += _reads(target, encode(target.key), write)
    if write:
        commands.append(_MULTI)
    anchors = sum(stack.found.anchor is not None for stack in stacks)
    owed = opening + timed + anchors + sum(target.replies for target in targets) + write
    sent_at = time.monotonic()
    try:
        ticket = session.post(b"".join(commands), owed)
    except TransportError:
        session.drop()  # replies may be owed on it: never read them later
        return [Taken() for _ in stacks]
    try:
        read = session.replies(ticket)
        opened = read[:opening] + ([read[-1]] if write else [])
        failed = _failure(read)
        if failed is not None:
            _end(session, write, opened)
            return [Taken(denied=acl_denial(failed)) for _ in stacks]
        now, at = _seconds(read[opening]) if timed else None, opening + timed
        found: list[Any] = []
        extra: list[bytes] = []
        for stack in stacks:
            anchor = None
            if stack.found.anchor is not None:
                anchor, at = read[at], at + 1
            mine = []
            for target in stack.targets:
                mine.append(read[at : at + target.replies])
                at += target.replies
            got, counted = _answer(stack, anchor, mine, write, now)
            if got is not None and stack.ttl and now is not None:
                late = now + (time.monotonic() - sent_at)
                if (stack.found.window + 1) * stack.ttl - late <= GUARD:
                    got = None  # the window nears its end: the script's
            found += [None] * (len(stack.targets) - 1) + [got]
            if got is not None and write and counted is not None:
                state, count = stack.found.state, min(counted, 2**32 - 1).to_bytes(4, "big")
                extra.append(pack_command(b"SETRANGE", state, _COUNT, count))
        pending = Pending(session, targets, write, None, keys)
        _send_writes(pending, found, opened, extra)
        taken = finish(pending)
    except TransportError:
        return [Taken() for _ in stacks]
    except BaseException:
        session.drop()  # a transaction may be open on it: never reuse the connection
        raise
    ends = itertools.accumulate(len(stack.targets) for stack in stacks)
    return [taken[end - 1] for end in ends]  # (a stack's answers are its newest key's)


def _watched(stack: Stack) -> list[str]:
    """Return the keys a stack's transaction watches: the anchor and every key it reads."""
    found = stack.found
    names = [name for name, _ in found.keys]
    if found.anchor is not None:
        names.append(found.anchor)
    if found.before is not None and not found.before[1]:
        names.append(found.before[0])  # absent: watched, so one appearing aborts the batch
    return names


_NONE: tuple[None, None] = (None, None)


def _answer(
    stack: Stack, anchor: Any, reads: list[list[Any]], write: bool, now: float | None
) -> tuple[Any, int | None]:
    """Answer a stack's batch from its keys' bytes; None: the script's. Also its new count."""
    found = stack.found
    if found.anchor is not None:
        if now is None or int(now) // stack.ttl != found.window:
            return _NONE
        absent = found.before is not None and not found.before[1]
        if not _anchored(anchor, stack.identity, found.window, absent):
            return _NONE
    copies = []
    for target, mine in zip(stack.targets, reads, strict=True):
        got = _copy(target, mine, write)
        if got is None:
            return _NONE  # lost, foreign or odd: the script finds out which
        copies.append(got)
    heads = {target.key: copy for target, (copy, _) in zip(stack.targets, copies, strict=True)}
    state = heads[found.state]
    if _generations(state) != found.generations:
        return _NONE  # grown meanwhile
    before = found.before
    if before is not None and before[1] and _generations(heads[before[0]]) != before[1]:
        return _NONE
    count = _u32(state)
    moved = stack.targets[-1].moved
    room = found.limit - 1 - count
    vectorised = not isinstance(moved, list)
    seen: Any = np.zeros(len(moved), dtype=bool) if vectorised else [False] * len(moved)
    older = stack.targets if not write else stack.targets[:-1]
    for target, (copy, _) in zip(older, copies, strict=False):
        seen = _either(seen, _kernel(target.moved)(copy, target.moved, False)[0])
    copy, read = copies[-1]
    if not write:
        return (copy, read, 0, (seen.tolist() if vectorised else seen, 0, 0)), None
    if room <= 0:  # full to the limit: only the script adds, as it alone grows the shard
        n = within(_either(seen, _kernel(moved)(copy, moved, False)[0]), 0)
        return ((copy, read, 0, ([True] * n, 0, 0)), None) if n else _NONE
    # Up to the element that could bring the count to the limit: the script takes the rest.
    n = within(seen, room)
    seen, newest = seen[:n], moved[:n]
    rest = newest[~seen] if vectorised else [m for m, s in zip(newest, seen, strict=True) if not s]
    added, low, high = _kernel(rest)(copy, rest, True)
    new = added.count(False)
    if vectorised:
        out = seen.copy()
        out[~seen] = added
        answers = out.tolist()
    else:
        left = iter(added)
        answers = [True if s else next(left) for s in seen]
    return (copy, read, 0, (answers, low, high)), (count + new if new else None)


def _either(seen: Any, answers: list[bool]) -> Any:
    """Return ``seen`` (a list or an array) or'ed element-wise with a kernel's ``answers``."""
    if isinstance(seen, list):
        return [a or b for a, b in zip(seen, answers, strict=True)]
    return seen | np.array(answers, dtype=bool)


def _ours(head: Any, identity: bytes) -> bool:
    return isinstance(head, bytes | bytearray) and bytes(head[:IDENTITY_BYTES]) == identity


def _seconds(reply: Any) -> float | None:
    """Return Redis's clock from ``TIME``'s reply; None for another reply."""
    if not isinstance(reply, list) or len(reply) != 2:
        return None
    try:
        return int(reply[0]) + int(reply[1]) / 1e6
    except (TypeError, ValueError):
        return None

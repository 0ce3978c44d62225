"""``add_many`` / ``contains_many``: snapshots of crowded shards, chunks of BITFIELD for the rest.

Elements are read in batches, hashed and grouped per shard (:class:`.local.Located`). A
shard with enough of a batch's elements, as the costs below weigh it, answers them
through a snapshot (:mod:`.snapshot`), or through a stack (:mod:`.stacks`) when it has
grown or the filter forgets. The other shards, and every snapshot or stack not taken
(the shard changed, is lost or odd, a window nears its end, a connection failed, an ACL
refused it), go through the chunks. Snapshot transactions overlap two at a time
(:meth:`Bulk._take_overlapped`).

Chunks: :data:`CHUNK` elements; per shard a ``GETRANGE`` of its identity, then
``BITFIELD key SET u1 <offset> 1 ...`` (or ``GET u1``) commands of about
:data:`COMMAND_BITS` bits: atomic, replying the old bits, so "were all k bits already
set" is check-and-add's answer, in less Redis time than a Lua ``redis.call``. A filter
that grows or forgets sends script calls of :data:`PER_SCRIPT` elements instead (only
the script crosses the growth boundary). Chunk n+1 is sent before chunk n's replies are read;
commands of chunk n run again (``NOSCRIPT``, a redirection) take chunk n+1's that did not
run along, after them, before chunk n+2 is sent: the answers stay those of the sequence.

A shard whose identity did not match answers "not there" for the chunk's elements in it
(its BITFIELD may have written into a lost shard's place), is recovered, and those
elements are added again. A failed command is run again through the executor; a write
that may have run (a chunk's, or a snapshot's ``EXEC``) answers "new" (ambiguous). If
anything interrupts the work, the connections with replies still owed are thrown away.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mmh3
from redis.utils import HIREDIS_AVAILABLE

from scrapy_redis_bloom.core.errors import (
    AccessDeniedError,
    FilterUnavailableError,
    foreign_reply,
)
from scrapy_redis_bloom.core.generations import Growth, seed_arguments
from scrapy_redis_bloom.core.hashing import FilterSpec, locate, offsets
from scrapy_redis_bloom.core.layout import HEADER_BITS, HEADER_BYTES, IDENTITY_BYTES
from scrapy_redis_bloom.engine.base import Outcome
from scrapy_redis_bloom.engine.bitmap.local import BLOCK_BYTES, HAVE_NUMPY, Located
from scrapy_redis_bloom.engine.bitmap.snapshot import Pending, Taken, Target, begin, finish, take
from scrapy_redis_bloom.engine.bitmap.snapshot import answer as answer_reads
from scrapy_redis_bloom.engine.bitmap.stacks import Found, Stack, probes, take_stacks
from scrapy_redis_bloom.engine.bitmap.stacks import probe as probe_reply
from scrapy_redis_bloom.engine.bitmap.wirecost import WireCost
from scrapy_redis_bloom.engine.parts import Parts
from scrapy_redis_bloom.engine.scripts import MISMATCH, script_reply
from scrapy_redis_bloom.transport.executor import Call, Executor, Kind, Session, classify
from scrapy_redis_bloom.transport.node import Node, ReplyLostError, Ticket, TransportError
from scrapy_redis_bloom.transport.topology import Topology
from scrapy_redis_bloom.transport.wire import BitfieldPacker, Script, encode, pack_command

logger = logging.getLogger(__name__)

#: Elements per chunk: ~1.3 MB of commands at k = 13, taken while Redis runs the one before.
CHUNK = 4_000
#: Bits per BITFIELD command (a multiple of k): ~1 ms of Redis time, as others wait.
COMMAND_BITS = 5_000
#: Elements read at a time when snapshots may be taken (numpy: up to MAX_BATCH).
BATCH = 131_072
MAX_BATCH = 1_048_576
#: With numpy, a batch holds enough per shard for a whole snapshot to cost this each.
WHOLE_NS_PER_ELEMENT = 250
#: A snapshot costs about SNAPSHOT_NS plus SNAPSHOT_NS_PER_BYTE per byte of the shard, against
#: BITFIELD_NS_PER_BIT per bit or SCRIPT_NS_PER_ELEMENT per element (bench/NOTES.md).
SNAPSHOT_NS = 200_000
SNAPSHOT_NS_PER_BYTE = 2
BITFIELD_NS_PER_BIT = 500
SCRIPT_NS_PER_ELEMENT = 10_000
#: Per element read by blocks (redis-py parses replies slower without hiredis); read only.
BLOCKS_NS_PER_ELEMENT = 2_500 if HIREDIS_AVAILABLE else 4_700
READ_BLOCK_NS = BLOCKS_NS_PER_ELEMENT // 2
#: Bytes on the wire per block read and written back, and per block only read.
BLOCK_WIRE_BYTES = 280
READ_WIRE_BYTES = 140
#: The most bytes of one snapshot transaction's shards (whole; by blocks).
JOINT_BYTES = 8 << 20
BLOCKS_JOINT_BYTES = 2 << 20
#: Whether snapshots are taken at all (the tests turn them off to exercise the chunks).
SNAPSHOTS = True
#: Elements per script call of the scripted bulk path: about 1 ms of Redis time.
PER_SCRIPT = 100


@dataclass(frozen=True)
class ScriptHooks:
    """The filter's side of the scripted bulk path (``scriptless()``: 0 for the script always)."""

    active: Callable[[], bool]
    script: Callable[[], Script]
    head: Callable[[int, bool, int], bytes]
    note: Callable[[int, int, int], None]
    mismatch: Callable[[int, str, object], None]
    scriptless: Callable[[], int]
    growth: Callable[[], Growth]


@dataclass(slots=True)
class _Command:
    """A command of a chunk: a shard's identity check, a BITFIELD, or a script (``call.script``)."""

    call: Call
    shard: int
    elements: range | None = None  # of the shard's group (None: the identity check)


@dataclass
class _Chunk:
    write: bool
    elements: Sequence[str | bytes]
    k: int  # values per element in a reply: k old bits, or the script's one answer
    #: Per shard: its elements' positions in the chunk, and their k offsets (or seeds) each.
    groups: dict[int, tuple[list[int], list[Any]]]
    #: Per node: its session and commands; replies owed, read or failed; may have run twice.
    plans: dict[int, tuple[Session, list[_Command]]]
    sent: dict[int, Ticket | list[Any] | TransportError] = field(default_factory=dict)
    redone: dict[int, list[bool]] = field(default_factory=dict)


class Bulk:
    """Runs bulk checks on a filter's shards (``allow``: "new" for what Redis could not take)."""

    def __init__(
        self,
        topology: Topology,
        executor: Executor,
        parts: Parts,
        identity: Callable[[int], bytes],
        recover: Callable[[Iterable[int]], None],
        allow: bool,
        hooks: ScriptHooks,
        again: Callable[[Iterable[int]], None],
    ) -> None:
        self.topology, self.executor, self.parts = topology, executor, parts
        self.identity, self.recover, self.allow, self.hooks = identity, recover, allow, hooks
        self.again = again  # recovers a shard the second pass still finds wrong
        self._snapshots = SNAPSHOTS  # (False once Redis's ACL refuses one)
        self._grown: set[int] = set()  # shards found grown: their batches go to stacks
        self._clock = 0.0  # Redis's clock minus this machine's, from the last TIME
        self._wire = WireCost(self.executor)

    @property
    def spec(self) -> FilterSpec:
        """The geometry in use (the record's)."""
        return self.parts.spec

    def run(
        self, write: bool, elements: Iterable[str | bytes], outcome: Outcome | None = None
    ) -> Outcome:
        """Check (and with ``write``, add) the elements; return the answers in order.

        ``outcome`` (a new one if None) is filled batch by batch: if a batch raises, it holds
        the counts of those before.
        """
        outcome = Outcome() if outcome is None else outcome
        if not self._snapshots:
            return self._run_chunks(write, elements, outcome)
        remaining = iter(elements)
        while batch := list(itertools.islice(remaining, batch_size(self.spec, self._least(False)))):
            self._run_batch(write, batch, outcome)
        return outcome

    def _least(self, scripted: bool) -> int:
        """Return the fewest elements of a shard worth a snapshot (of its blocks, if blocked)."""
        spec = self.spec
        each = SCRIPT_NS_PER_ELEMENT if scripted else BITFIELD_NS_PER_BIT * spec.hash_count
        if spec.block_bits and each > BLOCKS_NS_PER_ELEMENT:
            return max(1, -(-SNAPSHOT_NS // (each - BLOCKS_NS_PER_ELEMENT)))
        cost = SNAPSHOT_NS + SNAPSHOT_NS_PER_BYTE * spec.shard_bytes
        return max(1, -(-cost // each))

    def _whole(self, count: int, node: Node, key: str) -> bool:
        """Whether ``count`` elements of a shard read it whole (cheaper), not their blocks."""
        spec = self.spec
        if not spec.block_bits:
            return True
        extra = self._wire.extra(node.address, key)
        whole = (SNAPSHOT_NS_PER_BYTE + 2 * extra) * spec.shard_bytes
        return whole < (BLOCKS_NS_PER_ELEMENT + BLOCK_WIRE_BYTES * extra) * count

    def _run_batch(
        self, write: bool, batch: list[str | bytes], outcome: Outcome, defer: bool = True
    ) -> None:
        """Run a batch: snapshots for the shards with many of its elements, chunks for the rest.

        A shard full to its limit gives the script only the elements that may take it to
        its capacity; with ``defer``, its others run after as a batch of their own.
        """
        active = self.hooks.active()
        limit = (self.hooks.scriptless() or None) if active else None
        snapshots = self._snapshots and (not active or limit is not None)
        growth = self.hooks.growth() if self._snapshots and active else None
        groups: dict[int, Any] = {}
        if snapshots or growth is not None:
            located = Located(batch, self.spec, HAVE_NUMPY)
            groups = located.crowded(self._least(limit is not None or growth is not None))
        if not groups:
            _merge(outcome, self._run_chunks(write, batch))
            return
        answered: list[tuple[Any, list[bool]]] = []
        doubtful: set[int] = set()
        # Known grown (or windowed): to the stacks at once; a snapshot gives back the grown.
        cuts: dict[int, int] = {}
        fresh = {s: p for s, p in groups.items() if s not in self._grown} if snapshots else {}
        results = self._snapshots_of(fresh, located, write, limit)
        if growth is not None:
            handed = {s: p for s, p in groups.items() if s not in fresh}
            handed.update(
                (s, p)
                for s, p, taken in results
                if taken.answers is None and not taken.ambiguous and taken.denied is None
            )
            results = [r for r in results if r[0] not in handed]
            stacked, cuts = self._stacks_of(growth, handed, located, write)
            results += stacked
        deferred: list[int] = []
        if defer and cuts:  # (a full shard's stack may have answered past its cut: what it held)
            held = {int(p) for _, ps, t in results for p in ps[: len(t.answers or ())]}
            deferred = sorted({int(p) for s, cut in cuts.items() for p in groups[s][cut:]} - held)
        for _, positions, taken in results:
            if taken.answers is None:
                if taken.ambiguous:
                    doubtful.update(int(p) for p in positions)
                continue
            answered.append((positions[: len(taken.answers)], taken.answers))
            if write:
                seen = taken.answers.count(True)
                outcome.seen += seen
                outcome.added += len(taken.answers) - seen
        answers = located.placed(answered)
        others = located.outside([positions for positions, _ in answered] + [deferred])
        if others:
            second = self._run_chunks(write, [batch[p] for p in others])
            # The bits may be this batch's own, from a lost EXEC.
            _doubt(second, [n for n, p in enumerate(others) if p in doubtful], write)
            _merge(outcome, second, answers, others)
        if deferred:  # after the script took their shards' first elements over the boundary
            third = Outcome()
            self._run_batch(write, [batch[p] for p in deferred], third, defer=False)
            _merge(outcome, third, answers, deferred)
        outcome.answers.extend(answers)

    def _snapshots_of(
        self, groups: dict[int, Any], located: Located, write: bool, limit: int | None
    ) -> list[tuple[int, Any, Taken]]:
        """Take a batch's crowded shards' snapshots, per node; return (shard, positions, taken)."""
        batches = _Batches(self.topology.joint_transactions)
        length = HEADER_BYTES + self.spec.shard_bytes
        for s, positions in groups.items():
            key = self.parts.shard_key(s)
            node = self.topology.route(key, s, None)
            whole = self._whole(len(positions), node, key)
            target = Target(key, self.identity(s), located.offsets(positions), length, whole)
            size = length if whole else BLOCK_BYTES * len(positions)
            most = JOINT_BYTES if whole else min(JOINT_BYTES, BLOCKS_JOINT_BYTES)
            batches.join(node, size, (s, positions, target), most)
        taken = self._take_overlapped(batches, write, limit)
        results: list[tuple[int, Any, Taken]] = []
        for (node, batch), together in zip(batches, taken, strict=True):
            for (s, positions, target), one in zip(batch, together, strict=True):
                if one.aborted and len(batch) > 1:
                    session = self.executor.session(node, "check in bulk", write)
                    one = self._noted([target], take(session, [target], write, limit))[0]
                results.append((s, positions, one))
        return results

    def _take_overlapped(
        self, batches: list[tuple[Node, list[Any]]], write: bool, limit: int | None
    ) -> list[list[Taken]]:
        """Take each batch's snapshots, two transactions at a time (answered as Redis reads)."""
        out: list[list[Taken]] = []
        turns: dict[int, bool] = {}  # per node: whether its next batch takes the spare
        begun: list[Pending] = []  # in order; those not finished (from len(out) on) owe replies

        def start(index: int) -> None:
            if index < len(batches):
                node, batch = batches[index]
                spare = turns.get(id(node), False)
                turns[id(node)] = not spare
                session = self.executor.session(node, "check in bulk", write, spare=spare)
                begun.append(begin(session, [target for _, _, target in batch], write, limit))

        def end(index: int) -> None:
            targets = [target for _, _, target in batches[index][1]]
            out.append(self._noted(targets, finish(begun[index])))

        try:
            start(0)
            start(1)
            for index in range(len(batches)):
                answer_reads(begun[index])
                if index:  # the batch before: its EXEC ran while this one was answered
                    end(index - 1)
                start(index + 2)  # on the connection this one's EXEC went on
            if batches:
                end(len(batches) - 1)
        except BaseException:
            for pending in begun[len(out) :]:  # replies owed, or a transaction open
                pending.session.drop()  # never reuse them
            raise
        return out

    def _noted(self, targets: list[Target], taken: list[Taken]) -> list[Taken]:
        """Stop taking snapshots once Redis's ACL refused one of the targets'; return them."""
        for target, one in zip(targets, taken, strict=True):
            if one.denied is not None and self._snapshots:
                self._snapshots = False
                logger.info(
                    "Bulk checks use BITFIELD (or the script) from now on, no snapshots: the"
                    " Redis user may not run WATCH, GET, GETRANGE, STRLEN, MULTI, SETRANGE,"
                    " EXEC, DISCARD or UNWATCH on %r (ACL: refused the %s). Granting them"
                    " makes add_many and contains_many faster.",
                    target.key,
                    one.denied,
                )
        return taken

    def _stacks_of(
        self, growth: Growth, groups: dict[int, Any], located: Located, write: bool
    ) -> tuple[list[tuple[int, Any, Taken]], dict[int, int]]:
        """Answer grown or windowed shards' batches through stacks; also per full shard, its cut."""
        results: list[tuple[int, Any, Taken]] = []
        cuts: dict[int, int] = {}
        if not groups:
            return results, cuts
        ttl, key = growth.ttl, self.parts.key
        window = int((time.time() + self._clock) // ttl) if ttl else -1
        probed = {s: probes(key, s, ttl, window) for s in groups}
        calls = [call for probe in probed.values() for call in probe]
        try:
            replies = self.executor.run("check in bulk", calls, timeout=0, partial=True).replies
        except (FilterUnavailableError, AccessDeniedError):
            replies = [None] * len(calls)  # the chunks run into it, and report it
        batches = _Batches(self.topology.joint_transactions)
        at = 0
        for s, positions in groups.items():
            mine, at = replies[at : at + len(probed[s])], at + len(probed[s])
            found = None
            if all(reply is not None for reply in mine):
                if ttl and isinstance(mine[0], list) and len(mine[0]) == 2:
                    now = int(mine[0][0]) + int(mine[0][1]) / 1e6
                    self._clock = now - time.time()
                found = probe_reply(growth, key, s, self.identity(s), mine, window)
            if not ttl:
                self._grown.discard(s)
            if found is None or not self._snapshots:
                results.append((s, positions, Taken()))  # the script's
                continue
            # Full to its limit: the script takes its first new element over the boundary.
            full = write and found.count + 1 >= found.limit
            if full and found.generations < len(growth.generations):
                cuts[s] = max(PER_SCRIPT, found.capacity - found.count + 1)
            if not ttl and found.generations > 1:
                self._grown.add(s)
            if found.generations > 1:
                self.hooks.note(s, 0, found.generations)
            node = self.topology.route(self.parts.shard_key(s), s, None)
            extra = self._wire.extra(node.address, found.keys[-1][0])
            stack, size = _stack(growth, self.identity(s), positions, located, found, extra)
            batches.join(node, size, (s, positions, stack))
        for node, batch in batches:
            session = self.executor.session(node, "check in bulk", write)
            together = take_stacks(session, [stack for _, _, stack in batch], write)
            self._noted([stack.targets[-1] for _, _, stack in batch], together)
            results += [(s, p, one) for (s, p, _), one in zip(batch, together, strict=True)]
        return results, cuts

    def _run_chunks(
        self, write: bool, elements: Iterable[str | bytes], outcome: Outcome | None = None
    ) -> Outcome:
        outcome = Outcome() if outcome is None else outcome
        retry: list[tuple[int, str | bytes]] = []  # elements of shards that were recovered
        pending: _Chunk | None = None  # sent, replies not read yet
        prepared: _Chunk | None = None  # sent after pending, replies not read yet
        remaining = iter(elements)
        done = 0
        try:
            while chunk := list(itertools.islice(remaining, CHUNK)):
                prepared = self._prepare(write, chunk)
                self._send(prepared)
                if pending is not None:
                    retry += self._collect(pending, prepared, outcome, done)
                    done += len(pending.elements)
                pending, prepared = prepared, None
            if pending is not None:
                retry += self._collect(pending, None, outcome, done)
                pending = None
        finally:
            # Interrupted (the iterable raised, Redis refused...): replies may be owed.
            for unread in (pending, prepared):
                if unread is not None:
                    self._abandon(unread)
        if retry:  # check again the elements of shards recovered (their second answer)
            same = self.topology, self.executor, self.parts, self.identity
            again = Bulk(*same, self.again, self.allow, self.hooks, self.again)
            second = again.run(write, [element for _, element in retry])
            if write:  # the bits may be this call's own, set before the shard was found wrong
                _doubt(second, range(len(retry)), write)
            _merge(outcome, second, outcome.answers, [position for position, _ in retry])
        return outcome

    def _prepare(self, write: bool, elements: Sequence[str | bytes]) -> _Chunk:
        """Hash a chunk and plan its commands per node and shard (the script's: packed seeds)."""
        scripted = self.hooks.active()
        spec = self.spec
        k, size, block = spec.hash_count, spec.shard_bits, spec.block_bits
        groups: dict[int, tuple[list[int], list[Any]]] = {}
        for i, element in enumerate(elements):
            if scripted:
                h1, h2 = mmh3.hash64(element, seed=0, x64arch=True, signed=False)
                shard = h1 % spec.shards
                values: list[Any] = [seed_arguments(h1, h2, spec.shards, size, spec.seed_range)]
            else:  # (a shard's bits start after its header)
                shard, x, y = locate(element, spec)
                values = offsets(x, y, k, size, block, HEADER_BITS)
            group = groups.setdefault(shard, ([], []))
            group[0].append(i)
            group[1].extend(values)
        script = self.hooks.script() if scripted else None
        per = PER_SCRIPT if scripted else max(1, COMMAND_BITS // k)
        packer = BitfieldPacker(write)
        plans: dict[int, tuple[Session, list[_Command]]] = {}
        for shard, (positions, packed) in groups.items():
            key = self.parts.shard_key(shard)
            node = self.topology.route(key, shard, None)
            plan = plans.get(id(node))
            if plan is None:
                plan = plans[id(node)] = (self.executor.session(node), [])
            commands = plan[1]
            packed_key = encode(key)
            if not scripted:  # (the script checks the identity itself)
                check = pack_command(b"GETRANGE", key, 0, IDENTITY_BYTES - 1)
                commands.append(_Command(Call(check, key=key, shard=shard), shard))
            for first in range(0, len(positions), per):
                span = range(first, min(first + per, len(positions)))
                if not scripted:
                    payload = packer.pack(packed_key, packed[span.start * k : span.stop * k])
                else:
                    payload = self.hooks.head(shard, write, len(span))
                    payload += b"".join(packed[span.start : span.stop])
                call = Call(payload, key=key, shard=shard, script=script)
                commands.append(_Command(call, shard, span))
        return _Chunk(write, elements, 1 if scripted else k, groups, plans)

    def _send(self, chunk: _Chunk) -> None:
        for node_id, (session, commands) in chunk.plans.items():
            try:
                chunk.sent[node_id] = session.post(
                    b"".join(command.call.payload for command in commands), len(commands)
                )
            except TransportError as exc:
                chunk.sent[node_id] = exc

    def _abandon(self, chunk: _Chunk) -> None:
        for node_id, (session, _) in chunk.plans.items():
            if isinstance(chunk.sent.get(node_id), Ticket):
                session.drop()

    def _drain(self, chunk: _Chunk | None) -> None:
        """Read a later chunk's owed replies now, so another command may use its nodes."""
        if chunk is None:
            return
        for node_id, (session, _) in chunk.plans.items():
            sent = chunk.sent.get(node_id)
            if isinstance(sent, Ticket):
                try:
                    chunk.sent[node_id] = session.replies(sent)
                except TransportError as exc:
                    chunk.sent[node_id] = exc

    def _collect(
        self, chunk: _Chunk, later: _Chunk | None, outcome: Outcome, offset: int
    ) -> list[tuple[int, str | bytes]]:
        """Add a chunk's answers (failed ones run again); return its recovered shards' elements."""
        old_bits: dict[int, list[int]] = {shard: [] for shard in chunk.groups}
        doubtful: dict[int, set[int]] = {shard: set() for shard in chunk.groups}
        mismatched: dict[int, bytes] = {}
        parts: dict[int, tuple[str, str]] = {}  # a part a script found wrong: (shard key, part)
        try:
            for node_id, (replies, unsure) in self._replies(chunk, later).items():
                commands = chunk.plans[node_id][1]
                for command, reply, maybe_twice in zip(commands, replies, unsure, strict=True):
                    if isinstance(reply, BaseException):
                        raise self.parts.refusal(reply, command.call.key or "", "check in bulk")
                    try:
                        bits = self._read_reply(command, reply, chunk.k, mismatched, parts)
                    except ValueError as exc:
                        raise foreign_reply("a bulk check", command.call.key or "", exc) from None
                    old_bits[command.shard].extend(bits)
                    if maybe_twice and command.elements is not None:
                        doubtful[command.shard].update(command.elements)
        except FilterUnavailableError:
            self._abandon(chunk)
            if not self.allow:
                raise
            outcome.answers.extend([False] * len(chunk.elements))
            outcome.errors += len(chunk.elements)
            outcome.failed.extend(chunk.elements)
            return []
        size = len(chunk.elements)
        answers = [False] * size
        k = chunk.k
        for shard, (positions, _) in chunk.groups.items():
            if shard in mismatched:
                continue
            bits, unsure_here = old_bits[shard], doubtful[shard]
            for n, position in enumerate(positions):
                seen = 0 not in bits[n * k : n * k + k]
                if seen and n in unsure_here:
                    seen = False  # the set bits may be this call's own, from a lost reply
                    outcome.ambiguous += 1
                answers[position] = seen
        if chunk.write:
            added = size - sum(answers)
            outcome.added += added
            outcome.seen += size - added
        outcome.answers.extend(answers)
        if not mismatched:
            return []
        self._drain(later)  # recovery talks to these nodes too (this chunk's are read)
        try:
            for shard, (key, part) in parts.items():
                self.hooks.mismatch(shard, key, part)
        except FilterUnavailableError:  # a part out of reach for too long (a slot moving)
            if not self.allow:
                raise
            lost = [p for shard in mismatched for p in chunk.groups[shard][0]]
            for position in lost:
                outcome.answers[offset + position] = False
            outcome.added -= len(lost) if chunk.write else 0  # counted as added above
            outcome.errors += len(lost)
            outcome.failed.extend(chunk.elements[p] for p in lost)
            return []
        # Parts the hook sorted out; only a shard whose own key did not match is recovered.
        wrong = [shard for shard in mismatched if shard not in parts]
        if wrong:
            self.recover(wrong)
        return [
            (offset + position, chunk.elements[position])
            for shard in mismatched
            for position in chunk.groups[shard][0]
        ]

    def _read_reply(
        self,
        command: _Command,
        reply: Any,
        k: int,
        mismatched: dict[int, bytes],
        parts: dict[int, tuple[str, str]],
    ) -> list[int]:
        """Return a chunk command's old bits or answers; a wrong shard (or part) noted, not read."""
        shard, key, elements = command.shard, command.call.key or "", command.elements
        if elements is None:  # the shard's identity
            if not isinstance(reply, bytes):
                raise ValueError(f"a GETRANGE's bytes, got {reply!r:.200}")
            if reply != self.identity(shard):
                mismatched[shard] = reply
            return []
        if command.call.script is None:
            if not isinstance(reply, list) or len(reply) != k * len(elements):
                raise ValueError(f"a BITFIELD of {k * len(elements)} fields, got {reply!r:.200}")
            return reply
        got = script_reply(reply, len(elements))
        if got[0] == MISMATCH:
            if got[1].decode() != key:
                parts[shard] = key, got[1].decode()
            mismatched[shard] = b""
            return []
        if got[1] or got[2] > 1:
            self.hooks.note(shard, got[1], got[2])
        return got[3:]

    def _replies(
        self, chunk: _Chunk, later: _Chunk | None
    ) -> dict[int, tuple[list[Any], list[bool]]]:
        """Return per node a chunk's replies, and per command whether it may have run twice.

        What did not run runs again, the later chunk's after it: never a later element
        before an earlier one on its shard. Overtaken, its "seen" may be the later's bits.
        """
        got = {node_id: self._read(chunk, node_id) for node_id in chunk.plans}
        redo = [(chunk, node_id, i) for node_id, (_, _, failed) in got.items() for i in failed]
        if not redo:
            return {node_id: (replies, unsure) for node_id, (replies, unsure, _) in got.items()}
        # The executor may use any node: first read every reply owed, in sending order.
        self._drain(later)
        ran: set[int] = set()  # shards a later command wrote to (or may have)
        theirs: dict[int, tuple[list[Any], list[bool], list[int]]] = {}
        if later is not None:
            theirs = {node_id: self._read(later, node_id) for node_id in later.plans}
            for node_id, (_, unsure, failed) in theirs.items():
                commands = later.plans[node_id][1]
                redo += [(later, node_id, i) for i in failed]
                undone = set(failed)
                ran.update(
                    command.shard
                    for i, command in enumerate(commands)
                    if command.elements is not None and (i not in undone or unsure[i])
                )
        if chunk.write:
            for node_id, (_, unsure, failed) in got.items():
                _doubt_overtaken(chunk.plans[node_id][1], unsure, set(failed), set(ran))
        results = self.executor.run(
            "add in bulk" if chunk.write else "check in bulk",
            [owner.plans[node_id][1][i].call for owner, node_id, i in redo],
            write=chunk.write,
        )
        for (owner, node_id, i), reply, twice in zip(
            redo, results.replies, results.ambiguous, strict=True
        ):
            replies, unsure, _ = got[node_id] if owner is chunk else theirs[node_id]
            replies[i] = reply
            unsure[i] = unsure[i] or twice
        if later is not None:  # its replies are all in: its own turn reads them as they are
            for node_id, (replies, unsure, _) in theirs.items():
                later.sent[node_id] = replies
                later.redone[node_id] = unsure
        return {node_id: (replies, unsure) for node_id, (replies, unsure, _) in got.items()}

    def _read(self, chunk: _Chunk, node_id: int) -> tuple[list[Any], list[bool], list[int]]:
        """Return a node's replies for a chunk, which may have run twice, and which to run again."""
        session, commands = chunk.plans[node_id]
        sent = chunk.sent.get(node_id)
        if node_id in chunk.redone and isinstance(sent, list):  # run with an earlier chunk's
            return sent, chunk.redone[node_id], []
        if isinstance(sent, Ticket):
            try:
                sent = chunk.sent[node_id] = session.replies(sent)
            except ReplyLostError as exc:
                sent = chunk.sent[node_id] = exc
        if not isinstance(sent, list):
            lost = isinstance(sent, ReplyLostError) and chunk.write
            return [None] * len(commands), [lost] * len(commands), list(range(len(commands)))
        replies, unsure, redo = sent, [False] * len(commands), []
        for i, reply in enumerate(replies):
            kind = classify(reply)
            if kind is not Kind.RESULT:
                redo.append(i)  # a script stopped part way may have added some of its elements
                unsure[i] = chunk.write and kind is Kind.PARTIAL
        return replies, unsure, redo


def batch_size(spec: FilterSpec, least: int) -> int:
    """Return the elements a bulk call reads at a time: enough per shard for a cheap snapshot."""
    if not HAVE_NUMPY:
        return BATCH
    whole = -(-SNAPSHOT_NS_PER_BYTE * spec.shard_bytes // WHOLE_NS_PER_ELEMENT)
    return min(MAX_BATCH, max(BATCH, max(2 * least, whole) * spec.shards))


def _stack(
    growth: Growth, identity: bytes, positions: Any, located: Located, found: Found, extra: float
) -> tuple[Stack, int]:
    """Return a shard's stack (a target per key ``found`` names), and the bytes it reads."""
    by_generation: dict[int, Any] = {}
    targets: list[Target] = []
    size = 0
    for name, g in found.keys:
        gen = growth.generation(g)
        offsets = by_generation.get(g)
        if offsets is None:
            offsets = by_generation[g] = located.offsets(positions, gen if g else None)
        length = HEADER_BYTES + gen.nbytes
        newest = (name, g) == found.keys[-1]
        # Whole when its bytes (read, the newest's written back) cost less than its blocks.
        each = (BLOCKS_NS_PER_ELEMENT if newest else READ_BLOCK_NS) + extra * (
            BLOCK_WIRE_BYTES if newest else READ_WIRE_BYTES
        )
        whole = not gen.block_bits or (
            (SNAPSHOT_NS_PER_BYTE + extra) * gen.nbytes * (1 + newest) < each * len(positions)
        )
        target = Target(name, identity, offsets, length, whole, by_script=not HIREDIS_AVAILABLE)
        targets.append(target)
        size += length if whole else BLOCK_BYTES * len(positions)
    return Stack(identity, found, targets, growth.ttl), size


class _Batches(list[tuple[Node, list[Any]]]):
    """Shards' items per node, a transaction each (``joint``: one may name several shards)."""

    def __init__(self, joint: bool) -> None:
        super().__init__()
        self.joint = joint
        self._filling: dict[int, tuple[int, int]] = {}  # node -> (its open batch, bytes in it)

    def join(self, node: Node, size: int, item: Any, most: int = JOINT_BYTES) -> None:
        """Put a shard's ``item`` in its node's open batch, or a new one past ``most`` bytes."""
        index, held = self._filling.get(id(node), (-1, most))
        if held + size > most or not self.joint:
            index, held = len(self), 0
            self.append((node, []))
        self[index][1].append(item)
        self._filling[id(node)] = (index, held + size)


def _merge(
    outcome: Outcome, part: Outcome, answers: list[bool] | None = None, positions: Any = ()
) -> None:
    """Add a part's counts to an outcome, its answers after, or at ``positions`` of ``answers``."""
    if answers is None:
        outcome.answers.extend(part.answers)
    else:
        for position, answer in zip(positions, part.answers, strict=True):
            answers[position] = answer
    outcome.added += part.added
    outcome.seen += part.seen
    outcome.ambiguous += part.ambiguous
    outcome.errors += part.errors
    outcome.failed += part.failed


def _doubt(outcome: Outcome, indexes: Iterable[int], write: bool) -> None:
    """Answer "new" where ``outcome`` answered "seen" at ``indexes``: counted ambiguous."""
    for n in indexes:
        if outcome.answers[n]:
            outcome.answers[n] = False
            outcome.ambiguous += 1
            if write:
                outcome.seen -= 1
                outcome.added += 1


def _doubt_overtaken(
    commands: list[_Command], unsure: list[bool], failed: set[int], ran: set[int]
) -> None:
    """Mark doubtful a node's failed commands a later one of their shard (``ran``) overtook."""
    for i in range(len(commands) - 1, -1, -1):
        command = commands[i]
        if command.elements is None:
            continue
        if i in failed and command.shard in ran:
            unsure[i] = True
        if i not in failed or unsure[i]:
            ran.add(command.shard)

"""``add_many`` / ``contains_many``: elements in chunks, one BITFIELD per shard and batch.

Each chunk of :data:`CHUNK` elements is hashed in Python and grouped per shard; per
shard the batch sends ``GETRANGE`` of the shard's identity, then ``BITFIELD key SET u1
<offset> 1 ...`` (or ``GET u1``) commands of about :data:`COMMAND_BITS` bits each.
BITFIELD is atomic and replies the old bits, so "were all k bits already set" is
exactly check-and-add's answer, at ~0.2 µs of Redis time per bit against ~1 µs for a
Lua ``redis.call``. Chunk n+1 is sent before chunk n's replies are read, so Python
packs while Redis works.

What the hot path's script checks atomically, the bulk path checks per chunk: a shard
whose identity did not match answers "not there" for every element of the chunk in it
(its BITFIELD may have written into a lost shard's place), and is handed to the
filter's recovery, after which those elements are added again. A command that fails
is run again through the executor; if it was a write that may already have run, the
elements it carried answer "new" (ambiguous) whatever the re-run says. If the
iterable raises, or anything else interrupts the work, the connections with replies
still owed are thrown away, so no later call reads them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import FilterDamagedError, FilterUnavailableError
from ..hashing import FilterSpec, locate, offset_steps
from .executor import Call, Executor, Kind, classify
from .layout import HEADER_BITS, IDENTITY_BYTES
from .node import Node, ReplyLostError, Ticket, TransportError
from .parts import Parts
from .topology import Topology
from .wire import BitfieldPacker, encode, pack_command

#: Elements hashed, grouped per shard and sent together: ~1.3 MB of commands at k = 13,
#: small enough for the kernel to take the send at once while Redis works on the chunk
#: before (10,000 made the send wait for Redis, serialising the two: -10% on 2 vCPUs).
CHUNK = 4_000
#: Bits per BITFIELD command (a multiple of k is used): about 1 ms of Redis time, so
#: other clients wait no longer than that between two commands.
COMMAND_BITS = 5_000


@dataclass(slots=True)
class _Command:
    """A command of a chunk: a shard's identity check, or a BITFIELD over some elements."""

    call: Call
    shard: int
    #: Elements of the shard's group it carries (BITFIELD), or None (identity check).
    elements: range | None = None


@dataclass
class _Chunk:
    write: bool
    elements: Sequence[str | bytes]
    #: Per shard: the positions of its elements in the chunk, and their k offsets each.
    groups: dict[int, tuple[list[int], list[int]]]
    #: Per node: the node and its commands, in sending order.
    plans: dict[int, tuple[Node, list[_Command]]]
    #: Per node: a ticket of replies owed, the replies read early, or why none come.
    sent: dict[int, Ticket | list[Any] | TransportError] = field(default_factory=dict)


@dataclass(slots=True)
class Outcome:
    """What a bulk call found: answers in order, and counts for the filter's stats."""

    answers: list[bool] = field(default_factory=list)
    added: int = 0
    seen: int = 0
    ambiguous: int = 0
    errors: int = 0
    #: Elements Redis could not take (answered "new" by BLOOMFILTER_ON_ERROR = "allow").
    failed: list[str | bytes] = field(default_factory=list)


class Bulk:
    """Runs bulk checks on a filter's shards.

    ``identity(shard)`` returns the bytes the shard's header must start with (they
    change if the filter is adopted anew); ``recover(found)`` sorts out shards whose
    header did not match (it raises, or returns once they are usable); ``allow``:
    answer "new" for a chunk Redis could not take within the retry timeout, instead
    of raising.
    """

    def __init__(
        self,
        topology: Topology,
        executor: Executor,
        parts: Parts,
        identity: Callable[[int], bytes],
        recover: Callable[[dict[int, bytes]], None],
        allow: bool,
    ) -> None:
        self.topology = topology
        self.executor = executor
        self.parts = parts
        self.identity = identity
        self.recover = recover
        self.allow = allow

    @property
    def spec(self) -> FilterSpec:
        """The geometry in use (the record's)."""
        return self.parts.spec

    def run(self, write: bool, elements: Iterable[str | bytes]) -> Outcome:
        """Check (and with ``write``, add) the elements; return the answers in order."""
        outcome = Outcome()
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
        if retry:
            self._again(write, retry, outcome)
        return outcome

    def _again(self, write: bool, retry: list[tuple[int, str | bytes]], outcome: Outcome) -> None:
        """Check again the elements of shards that were recovered; keep "new" answers."""
        again = Bulk(self.topology, self.executor, self.parts, self.identity, _refuse, self.allow)
        second = again.run(write, [element for _, element in retry])
        for (position, _), answer in zip(retry, second.answers, strict=True):
            outcome.answers[position] = answer
        outcome.added += second.added
        outcome.seen += second.seen
        outcome.ambiguous += second.ambiguous
        outcome.errors += second.errors
        outcome.failed += second.failed

    # -- planning --------------------------------------------------------------------

    def _prepare(self, write: bool, elements: Sequence[str | bytes]) -> _Chunk:
        """Hash a chunk and plan its commands: per node, per shard, COMMAND_BITS bits each."""
        spec = self.spec
        k, size, shards = spec.hash_count, spec.shard_bits, spec.shards
        steps = offset_steps(k)
        base = HEADER_BITS  # a shard's bits start after its header
        groups: dict[int, tuple[list[int], list[int]]] = {}
        for i, element in enumerate(elements):
            shard, x, y = locate(element, shards, size)
            group = groups.get(shard)
            if group is None:
                group = groups[shard] = ([], [])
            group[0].append(i)
            group[1].extend([(x + j * y + c) % size + base for j, c in steps])  # offsets(), inlined
        per_command = max(1, COMMAND_BITS // k)
        packer = BitfieldPacker(write)
        plans: dict[int, tuple[Node, list[_Command]]] = {}
        for shard, (positions, bits) in groups.items():
            key = self.parts.shard_key(shard)
            node = self.topology.route(key, shard, None)
            commands = plans.setdefault(id(node), (node, []))[1]
            check = pack_command(b"GETRANGE", key, 0, IDENTITY_BYTES - 1)
            commands.append(_Command(Call(check, key=key, shard=shard), shard))
            packed_key = encode(key)
            for first in range(0, len(positions), per_command):
                span = range(first, min(first + per_command, len(positions)))
                payload = packer.pack(packed_key, bits[span.start * k : span.stop * k])
                commands.append(_Command(Call(payload, key=key, shard=shard), shard, span))
        return _Chunk(write, elements, groups, plans)

    # -- sending and reading -----------------------------------------------------------

    def _send(self, chunk: _Chunk) -> None:
        for node_id, (node, commands) in chunk.plans.items():
            try:
                chunk.sent[node_id] = node.send(
                    b"".join(command.call.payload for command in commands), len(commands)
                )
            except TransportError as exc:
                chunk.sent[node_id] = exc

    def _abandon(self, chunk: _Chunk) -> None:
        """Throw away the connections on which a chunk's replies are still owed."""
        for node_id, (node, _) in chunk.plans.items():
            if isinstance(chunk.sent.get(node_id), Ticket):
                node.abandon()

    def _drain(self, chunk: _Chunk | None) -> None:
        """Read a later chunk's owed replies now, so another command may use its nodes."""
        if chunk is None:
            return
        for node_id, (node, _) in chunk.plans.items():
            sent = chunk.sent.get(node_id)
            if isinstance(sent, Ticket):
                try:
                    chunk.sent[node_id] = node.receive(sent)
                except TransportError as exc:
                    chunk.sent[node_id] = exc

    def _collect(
        self,
        chunk: _Chunk,
        later: _Chunk | None,
        outcome: Outcome,
        offset: int,
    ) -> list[tuple[int, str | bytes]]:
        """Read a chunk's replies (running failed commands again); add its answers.

        Returns the elements of shards that had to be recovered, with their positions,
        for a second pass.
        """
        k = self.spec.hash_count
        write = chunk.write
        old_bits: dict[int, list[int]] = {shard: [] for shard in chunk.groups}
        doubtful: dict[int, set[int]] = {shard: set() for shard in chunk.groups}
        mismatched: dict[int, bytes] = {}
        try:
            for node_id, (node, commands) in chunk.plans.items():
                replies, unsure = self._replies(chunk, node_id, node, commands, later)
                for command, reply, maybe_twice in zip(commands, replies, unsure, strict=True):
                    if isinstance(reply, BaseException):
                        raise self.parts.refusal(reply, command.call.key or "", "check in bulk")
                    if command.elements is None:
                        found = bytes(reply)
                        if found != self.identity(command.shard):
                            mismatched[command.shard] = found
                        continue
                    old_bits[command.shard].extend(reply)
                    if maybe_twice:
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
        if write:
            added = size - sum(answers)
            outcome.added += added
            outcome.seen += size - added
        outcome.answers.extend(answers)
        if not mismatched:
            return []
        self._drain(later)  # recovery talks to these nodes too (this chunk's are read)
        self.recover(mismatched)
        return [
            (offset + position, chunk.elements[position])
            for shard in mismatched
            for position in chunk.groups[shard][0]
        ]

    def _replies(
        self,
        chunk: _Chunk,
        node_id: int,
        node: Node,
        commands: list[_Command],
        later: _Chunk | None,
    ) -> tuple[list[Any], list[bool]]:
        """Return a node's replies for a chunk, and per command whether it may have run twice."""
        sent = chunk.sent.get(node_id)
        replies: list[Any] | None = None
        lost = isinstance(sent, ReplyLostError)
        if isinstance(sent, Ticket):
            try:
                replies = chunk.sent[node_id] = node.receive(sent)
            except ReplyLostError as exc:
                chunk.sent[node_id] = exc
                lost = True
        elif isinstance(sent, list):
            replies = sent
        if replies is None:
            redo = list(range(len(commands)))
            replies = [None] * len(commands)
        else:
            redo = [i for i, reply in enumerate(replies) if classify(reply) is not Kind.RESULT]
        unsure = [lost and chunk.write] * len(commands)
        if redo:
            # The executor may use any node: first read every reply owed on them, this
            # chunk's, then the next one's (the order they were sent in).
            self._drain(chunk)
            self._drain(later)
            results = self.executor.run(
                "add in bulk" if chunk.write else "check in bulk",
                [commands[i].call for i in redo],
                write=chunk.write,
            )
            for i, reply, twice in zip(redo, results.replies, results.ambiguous, strict=True):
                replies[i] = reply
                unsure[i] = unsure[i] or twice
        return replies, unsure


def _refuse(found: dict[int, bytes]) -> None:
    """Recovery for a second pass: shards that still do not match were not recovered."""
    raise FilterDamagedError(
        f"Shard(s) {sorted(found)} of the Bloom filter still do not carry its id after"
        " being recovered."
    )

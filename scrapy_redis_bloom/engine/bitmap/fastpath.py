"""The hot path without a script: one ``BITFIELD`` per check, when a shard allows it.

On a shard that neither forgets (no TTL) nor has grown: ``BITFIELD {KEY:i}:g0 GET i64 32
[INCRBY u48 208 <n>] SET u1 <o1> 1 ...``. It is atomic and replies every field's old value:
"all k bits were set" is the answer. The first field reads 8 bytes of the filter's id from the
header; another id means a lost shard or a reset filter, and goes to recovery.

One command cannot raise a growing shard's count only for a new element, so each worker keeps
the items it found new and sends them with one check in :data:`STATE_EVERY` (sooner when that
many are owed), and on sync or close. A count whose reply is lost is not sent again (the
check's retry goes without it): it may have run, and counted twice a shard would start its
next generation early; counted as sent, it is short at worst. Only the script crosses the
growth boundary, so this path stops below :attr:`.Growth.scriptless_limit`, with room for
what every live worker may still hold. If a shard grew since this worker's last look, its
element went to generation 0, which every check still reads: "seen" is a true answer, "new"
at worst a duplicate fetch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scrapy_redis_bloom.core.generations import GENERATIONS_BIT, Growth
from scrapy_redis_bloom.core.hashing import offsets, place
from scrapy_redis_bloom.core.layout import HEADER_BITS
from scrapy_redis_bloom.transport.wire import SET_BIT, Arg, Script, command_head, pack_command

#: A worker's checks of a shard between two that read its state (and send its count).
STATE_EVERY = 16

#: Bit offsets in a shard's header: 8 bytes of the filter id; the state (u16 + u32).
ID_FIELD = 32
STATE_FIELD = GENERATIONS_BIT


def id_field(identity: bytes) -> int:
    """Return what ``GET i64 32`` replies for a shard carrying ``identity``."""
    return int.from_bytes(identity[ID_FIELD // 8 : ID_FIELD // 8 + 8], "big", signed=True)


@dataclass
class _Shard:
    """What this worker knows of one shard: its command's start, and its count."""

    plain: str  # the command's start, without the state field
    stated: str  # and with it
    key: str
    expected: int
    since: int = 0  # checks since the last that read the state
    #: Items in generation 0 at the last look, plus those sent since (None: not looked yet).
    count: int | None = None
    #: Items packed since, not sent: counted new until a reply finds them seen (below 0:
    #: sent ahead for items then found seen, so the next send is less).
    pending: int = 0
    #: Grown, or near the limit (``edge``, as of its last look): its checks are the script's.
    grown: bool = False
    near: bool = False
    edge: int = 0


@dataclass(slots=True)
class Command:
    """One element's check-and-add, packed: a BITFIELD (``fast`` packed it) or the script."""

    shard: int
    key: str
    payload: bytes
    script: Script | None = None  # what an EVALSHA runs; None for BITFIELD
    fast: FastPath | None = None
    #: BITFIELD: the count it adds, the fields read before the bits, the bits it sets.
    counted: int = 0
    fields: int = 0
    bits: list[int] | None = None
    #: The command without its count, for a retry (a count sent twice grows a shard early).
    resend: bytes | None = None

    def give_back(self) -> None:
        """Keep the count it carried for a later command: this one did not run (nor added)."""
        if self.fast is not None:
            self.fast.give_back(self.shard, self.counted - 1)


@dataclass
class FastPath:
    """Packs and reads the scriptless check-and-add of one filter (``workers()``: leases)."""

    growth: Growth
    shard_key: Any
    identity: Any
    workers: Callable[[], int] = lambda: 1
    _shards: dict[int, _Shard] = field(default_factory=dict)

    def __post_init__(self) -> None:
        spec = self.growth.spec
        self.shards, self.size, self.k = spec.shards, spec.shard_bits, spec.hash_count
        self.block, self.seeds = spec.block_bits, spec.seed_range
        self.counted = self.growth.expansion > 0
        self.limit = self.growth.scriptless_limit if self.counted else 0
        self.first = self.growth.first_capacity
        self._ops = SET_BIT * self.k

    @staticmethod
    def applies(growth: Growth) -> bool:
        """Tell whether a filter has this path: it does not forget, and may grow."""
        return not growth.ttl and (not growth.expansion or growth.scriptless_limit > 0)

    def _shard(self, shard: int) -> _Shard:
        known = self._shards.get(shard)
        if known is None:
            key = self.shard_key(shard)
            args: list[Arg] = [b"BITFIELD", key, b"GET", b"i64", ID_FIELD]
            plain = command_head(len(args) + 4 * self.k, *args)
            stated = command_head(len(args) + 4 + 4 * self.k, *args, b"INCRBY", b"u48", STATE_FIELD)
            known = self._shards[shard] = _Shard(
                plain.decode("latin-1"),
                stated.decode("latin-1"),
                key,
                id_field(self.identity(shard)),
            )
        return known

    def pack(self, h1: int, h2: int) -> Command | None:
        """Return the command for an element; None: the script's (grown, or near the limit)."""
        shard, x, y = place(h1, h2, self.shards, self.size, self.seeds)
        known = self._shards.get(shard) or self._shard(shard)
        if self.counted:
            if known.grown or known.near:
                return None
            if known.count is None and known.pending >= STATE_EVERY:
                return None  # its first look is on its way: no more than a worker may hold
            if known.count is not None and known.count + known.pending + 1 >= known.edge:
                known.near = True  # till a look finds room (a state read's reply)
                return None
        args: list[int] = []
        bits = offsets(x, y, self.k, self.size, self.block, HEADER_BITS)
        for offset in bits:
            args += (len(str(offset)), offset)
        text = known.plain
        sent, fields = 0, 1
        ops = self._ops % tuple(args)
        resend = None
        if self.counted:
            known.since += 1
            if known.count is None or known.since >= STATE_EVERY or known.pending >= STATE_EVERY:
                known.since = 0
                sent = max(known.pending, 0)
                known.pending -= sent
                if known.count is not None:
                    known.count += sent  # there once it lands (its reply tells the count)
                if sent:
                    resend = (text + ops).encode("latin-1")
                text = f"{known.stated}${len(str(sent))}\r\n{sent}\r\n"
                fields = 2
            known.pending += 1
        payload = (text + ops).encode("latin-1")
        return Command(shard, known.key, payload, None, self, sent, fields, bits, resend)

    def give_back(self, shard: int, sent: int) -> None:
        """Take back the count a command (or a flush) carried that surely did not run."""
        self._shard(shard).pending += sent

    def read(self, shard: int, reply: Any, fields: int) -> tuple[bool | None, int]:
        """Return a reply's answer (True: seen; None: not this filter's) and the generations."""
        if not isinstance(reply, list) or len(reply) != fields + self.k:
            raise ValueError(f"a BITFIELD of {fields + self.k} fields, got {reply!r:.200}")
        known = self._shards.get(shard) or self._shard(shard)
        if reply[0] != known.expected:
            known.count, known.pending = None, 0  # what it counted went to the wrong key
            return None, 1
        seen = 0 not in reply[fields:]
        if not self.counted:
            return seen, 1
        if fields == 1:  # no state read: only this worker's count moves
            known.pending -= seen
            return seen, 1
        known.pending -= seen
        generations, count = divmod(reply[1], 1 << 32)
        self._note(known, generations, count)
        return seen, max(generations, 1)

    def _note(self, known: _Shard, generations: int, count: int) -> None:
        """Note a shard's state as read: grown, or its count (and how near its limit)."""
        if generations > 1:  # it grew since this worker looked
            known.grown = True
            known.pending = 0  # the count in Redis is now the newest generation's
            return
        # Never below what this worker sent since (a batch's later commands land later).
        known.count = count if known.count is None else max(known.count, count)
        # Each other live worker may hold up to STATE_EVERY items not counted yet.
        known.edge = min(self.limit, self.first - STATE_EVERY * self.workers())
        known.near = known.count + known.pending + 1 >= known.edge

    def blind(self, shard: int) -> bool:
        """Tell whether a shard's checks need its count, not read yet (a batch's plan)."""
        known = self._shards.get(shard)
        return self.counted and (known is None or (known.count is None and not known.grown))

    def unknown(self, shards: set[int]) -> list[tuple[int, str, bytes]]:
        """Return ``(shard, key, read)`` for the shards whose count was never read here.

        A batch reads them first: it plans every check before any reply, so without a count
        its fast checks would not stop at the growth boundary (only the script crosses it).
        """
        if not self.counted:
            return []
        out = []
        for shard in sorted(shards):
            known = self._shards.get(shard) or self._shard(shard)
            if known.count is None and not known.grown:
                read = (b"BITFIELD_RO", known.key, b"GET", b"i64", ID_FIELD)
                out.append((shard, known.key, pack_command(*read, b"GET", b"u48", STATE_FIELD)))
        return out

    def looked(self, shard: int, reply: Any) -> None:
        """Note a shard's state from :meth:`unknown`'s read (another filter's: left unknown)."""
        known = self._shard(shard)
        if isinstance(reply, list) and len(reply) == 2 and reply[0] == known.expected:
            self._note(known, *divmod(reply[1], 1 << 32))

    def flushes(self, only: int | None = None) -> list[tuple[int, str, bytes, int]]:
        """Return ``(shard, key, command, items)`` per shard with items owed (``only``: one)."""
        out = []
        shards = self._shards
        if only is not None:
            shards = {only: shards[only]} if only in shards else {}
        for shard, known in shards.items():
            if known.pending > 0 and not known.grown:
                n, known.pending = known.pending, 0
                command = pack_command(b"BITFIELD", known.key, b"INCRBY", b"u48", STATE_FIELD, n)
                out.append((shard, known.key, command, n))
        return out

"""The hot path without a script: one ``BITFIELD`` per check, when a shard allows it.

A check-and-add of one element on a shard that neither forgets (no TTL) nor has
grown is a single command::

    BITFIELD {KEY:i}:g0 GET i64 32 [INCRBY u48 208 <n>] SET u1 <o1> 1 ... SET u1 <ok> 1

(the state field only on some checks of a growing shard, see below).

``BITFIELD`` is atomic and replies the old value of every field, so "were all k bits
already set" is check-and-add's answer, at a fraction of the script's Redis time. The
first field reads 8 bytes of the filter's id from the shard's header: a reply with
another id was not written where this worker believes (the shard was lost, or the
filter reset), and goes to the filter's recovery, its answer discarded.

A growing shard also needs its count of items, which decides when it grows. One
command cannot raise it only when the element turns out new, so each worker keeps the
items it found new and sends them with one of its checks in :data:`STATE_EVERY` on that
shard (sooner when that many are owed), and when it syncs or closes: ``INCRBY u48 208
<n>`` on the header's state (generations u16, count u32) adds them and replies both.
Only the script crosses the growth boundary, so this path is used while the count
stays under :attr:`.Growth.scriptless_limit`, with room for the counts every live
worker may still hold (:data:`STATE_EVERY` each, workers counted by the lease
registry). A shard found grown, or near its limit, is left to the script from then on.

What this path cannot see, and why it is safe: if a shard grew after this worker's
last look (at most :data:`STATE_EVERY` checks ago), its element went to generation 0,
which is still read by every check; "seen" there is a true Bloom answer, "new" at
worst a duplicate fetch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scrapy_redis_bloom.core.generations import GENERATIONS_BIT, Growth
from scrapy_redis_bloom.core.hashing import offsets, place
from scrapy_redis_bloom.core.layout import HEADER_BITS
from scrapy_redis_bloom.transport.wire import Arg, Script, command_head, pack_command

#: A worker's checks of a shard between two that read its state (and send its count).
STATE_EVERY = 16

#: Where the fields read before the bits live in a shard's header (bit offsets): 8 of
#: the 16 random bytes of the filter id; the state, generations (u16) then count (u32),
#: as one u48.
ID_FIELD = 32
STATE_FIELD = GENERATIONS_BIT


def id_field(identity: bytes) -> int:
    """Return what ``GET i64 32`` replies for a shard carrying ``identity``."""
    return int.from_bytes(identity[ID_FIELD // 8 : ID_FIELD // 8 + 8], "big", signed=True)


@dataclass
class _Shard:
    """What this worker knows of one shard: its command's start, and its count."""

    #: The command's start: without the state field, and with it.
    plain: str
    stated: str
    key: str
    expected: int
    #: Checks since the last that read the state.
    since: int = 0
    #: Items in generation 0 at this worker's last look (None: not looked yet).
    count: int | None = None
    #: Items this worker found new since, not yet added to the count in Redis.
    pending: int = 0
    #: It has grown (its count is a later generation's), or its count nears the limit:
    #: its checks are the script's from now on.
    grown: bool = False
    near: bool = False


@dataclass(slots=True)
class Command:
    """One element's check-and-add, packed: a BITFIELD (``fast`` packed it) or the script."""

    shard: int
    key: str
    payload: bytes
    #: The script an ``EVALSHA`` payload runs (loaded on ``NOSCRIPT``); None for BITFIELD.
    script: Script | None = None
    fast: FastPath | None = None
    #: Items it adds to the shard's count (scriptless path), to give back if it never ran.
    counted: int = 0
    #: Fields its BITFIELD reads before the bits (scriptless path).
    fields: int = 0
    #: The bit offsets it sets (scriptless path), to take back from a shard not this filter's.
    bits: list[int] | None = None

    def give_back(self) -> None:
        """Keep the count it carried for a later command: this one did not run."""
        if self.fast is not None:
            self.fast.lost(self.shard, self.counted)


@dataclass
class FastPath:
    """Packs and reads the scriptless check-and-add of one filter (see the module doc).

    ``growth``: the filter's geometry and growth (TTL filters have no fast path);
    ``shard_key(i)`` and ``identity(i)``: a shard's key and the header it must carry.
    """

    growth: Growth
    shard_key: Any
    identity: Any
    #: How many workers hold a live lease (their late counts widen the margin).
    workers: Callable[[], int] = lambda: 1
    _shards: dict[int, _Shard] = field(default_factory=dict)

    def __post_init__(self) -> None:
        spec = self.growth.spec
        self.shards, self.size, self.k = spec.shards, spec.shard_bits, spec.hash_count
        self.block, self.seeds = spec.block_bits, spec.seed_range
        self.counted = self.growth.expansion > 0
        self.limit = self.growth.scriptless_limit if self.counted else 0
        self.first = self.growth.first_capacity
        self._ops = "$3\r\nSET\r\n$2\r\nu1\r\n$%d\r\n%d\r\n$1\r\n1\r\n" * self.k

    @staticmethod
    def applies(growth: Growth) -> bool:
        """Tell whether a filter has this path: it does not forget, and may grow."""
        return not growth.ttl and (not growth.expansion or growth.scriptless_limit > 0)

    def _shard(self, shard: int) -> _Shard:
        known = self._shards.get(shard)
        if known is None:
            key = self.shard_key(shard)
            args: list[Arg] = [b"BITFIELD", key, b"GET", b"i64", ID_FIELD]
            # The argument counts cover the bits (and the count) to come.
            plain = command_head(len(args) + 4 * self.k, *args)
            stated = command_head(len(args) + 4 + 4 * self.k, *args, b"INCRBY", b"u48", STATE_FIELD)
            known = _Shard(
                plain.decode("latin-1"),
                stated.decode("latin-1"),
                key,
                id_field(self.identity(shard)),
            )
            self._shards[shard] = known
        return known

    def pack(self, h1: int, h2: int) -> Command | None:
        """Return the command for an element (hashes ``h1``, ``h2``); None: use the script.

        The command carries the count it sends (what it adds to the shard's count:
        :meth:`lost` gives it back when the command surely did not run) and the fields
        it reads before the bits (1, or 2 with the state). None when the element's
        shard has grown or nears its limit: its checks are the script's.
        """
        shard, x, y = place(h1, h2, self.shards, self.size, self.seeds)
        known = self._shards.get(shard) or self._shard(shard)
        if self.counted and (known.grown or known.near):
            return None
        args: list[int] = []
        # A shard's bits start after its header.
        bits = offsets(x, y, self.k, self.size, self.block, HEADER_BITS)
        for offset in bits:
            args += (len(str(offset)), offset)
        text = known.plain
        sent, fields = 0, 1
        if self.counted:
            known.since += 1
            if known.count is None or known.since >= STATE_EVERY or known.pending >= STATE_EVERY:
                known.since = 0
                sent, known.pending = known.pending, 0
                text = f"{known.stated}${len(str(sent))}\r\n{sent}\r\n"
                fields = 2
        payload = (text + self._ops % tuple(args)).encode("latin-1")
        return Command(shard, known.key, payload, None, self, sent, fields, bits)

    def strays(self, command: Command, reply: list[Any]) -> tuple[bytes, list[int]]:
        """Return what a command that found a foreign shard set there: its id field, bits.

        A ``BITFIELD`` sets its bits before its reply can show the shard is not this
        filter's (a reset under the same key, a lost shard): the bits it found clear
        were set in another filter, and :data:`.scripts.TAKE_BACK` clears them.
        """
        found = reply[0].to_bytes(8, "big", signed=True)
        old = reply[command.fields :]
        return found, [bit for bit, was in zip(command.bits or [], old, strict=True) if not was]

    def lost(self, shard: int, sent: int) -> None:
        """Take back the count a command carried that surely did not run."""
        self._shard(shard).pending += sent

    give_back = lost

    def read(self, shard: int, reply: Any, fields: int) -> tuple[bool | None, int]:
        """Return a reply's answer and the shard's generations (1: it does not grow).

        ``fields``: the fields the command read before the bits (see :meth:`pack`).

        The answer is True for "seen", None when the shard is not this filter's.

        A reply of the wrong shape raises ``ValueError``: it is not this command's.
        """
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
            known.pending += int(not seen)
            return seen, 1
        generations, count = divmod(reply[1], 1 << 32)
        if generations > 1:  # it grew since this worker looked
            known.grown = True
            known.pending = 0  # the count in Redis is now the newest generation's
        else:
            known.count = count
            known.pending += int(not seen)
            # Each other live worker may hold up to STATE_EVERY items not counted yet.
            late = STATE_EVERY * self.workers()
            known.near = count + known.pending + 1 >= min(self.limit, self.first - late)
        return seen, max(generations, 1)

    def flushes(self, only: int | None = None) -> list[tuple[int, str, bytes, int]]:
        """Return ``(shard, key, command, items)`` per shard with items still to count.

        Each command adds the items to the shard's count; :meth:`lost` gives them back
        when it fails. ``only``: that shard's, if any (before its script takes over).
        """
        out = []
        shards = self._shards
        if only is not None:
            shards = {only: shards[only]} if only in shards else {}
        for shard, known in shards.items():
            if known.pending and not known.grown:
                n, known.pending = known.pending, 0
                command = pack_command(b"BITFIELD", known.key, b"INCRBY", b"u48", STATE_FIELD, n)
                out.append((shard, known.key, command, n))
        return out

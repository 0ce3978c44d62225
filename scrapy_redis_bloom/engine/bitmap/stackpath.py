"""The hot path of a shard that has grown or forgets: plain reads, then one ``BITFIELD``.

A grown shard keeps its bits in generations ``{KEY:i}:g0`` ... ``:g<G-1>``; with re-crawl
windows (``BLOOMFILTER_TTL``), in those of two windows, ``{KEY:i}:w<w-1>:g<g>`` and
``{KEY:i}:w<w>:g<g>`` (:mod:`..generations`). Only the newest generation of the current
window takes adds; every other key is read-only. So a check needs no script:

1. **Reads**, one pipelined round trip: for every key the element may be in, its bits
   (``GETRANGE`` of its 64-byte block when blocked, else ``BITFIELD_RO ... GET u1``);
   every :data:`HEADER_EVERY` checks of a shard, every key's header too (its identity
   and, in a generation 0, the generations and the newest one's count); with windows,
   ``TIME`` now and then (:mod:`..clock`). "Seen" when every bit is set in a key of
   this filter: a seen URL costs this one round trip.
2. **The add**, only for an element found in none of them: one ``BITFIELD`` on the
   newest generation (:meth:`StackPath._pack_add`), whose reply decides atomically which
   of several workers offering the element at once is told "new": exactly one.

The script (:mod:`.scripts`) stays the authority wherever this path cannot be sure: a
key whose header is missing or foreign (the script reports it, the filter recovers), a
shard whose generations changed since this worker looked, a newest generation near its
capacity (only the script starts the next one: :meth:`StackPath._near`), a window not
started yet, and the last :data:`..clock.GUARD` seconds of a window. Items found new are
counted as :mod:`.fastpath`'s, kept by the worker and sent with an add, or on sync or close.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scrapy_redis_bloom.core import layout
from scrapy_redis_bloom.core.generations import GENERATIONS_BIT, Generation, Growth, window_key
from scrapy_redis_bloom.core.hashing import WIDE, offsets
from scrapy_redis_bloom.core.layout import HEADER_BITS, HEADER_BYTES, IDENTITY_BYTES
from scrapy_redis_bloom.engine.bitmap.fastpath import ID_FIELD, STATE_EVERY, id_field
from scrapy_redis_bloom.engine.clock import TIME, Clock, Known
from scrapy_redis_bloom.transport.wire import SET_BIT, command_head, pack_command

#: A shard's checks between two that read every key's header.
HEADER_EVERY = 16

#: What a read round decided (see :meth:`StackPath.judge`).
SEEN, ADD, SCRIPT = "seen", "add", "script"

_HEADER = b"$1\r\n0\r\n$2\r\n%d\r\n" % (HEADER_BYTES - 1)
#: An add's read of its generation's seal (once a later one started).
_SEAL = (b"GET", b"u16", GENERATIONS_BIT)


def _were_set(reply: Any, k: int, identity: int) -> bool | None:
    """Tell from an add's reply whether all were set; None: the key is not this filter's."""
    if not isinstance(reply, list) or len(reply) != 2 + k:
        raise ValueError(f"a BITFIELD of {2 + k} fields, got {reply!r:.200}")
    if reply[0] != identity:
        return None
    return 0 not in reply[2:]


@dataclass
class _Shard(Known):
    """What this worker knows of one shard: its keys' generations, and its count."""

    #: Generations of the window before (0: none; -1: missing, lost or never: the script's).
    before: int = 1
    #: Generations of the shard, or of the current window.
    now: int = 2
    #: Items in the newest generation at the last read (plus sent since); judged new, unsent.
    count: int = 0
    pending: int = 0


@dataclass(slots=True)
class _Key:
    """One key a check reads: its name, generation, the element's bits in it."""

    name: str
    generation: int
    current: bool  # of the shard or the current window, not the window before
    newest: bool  # the newest generation of the current window (where adds go)
    #: Bit offsets of the element, relative to ``block`` (its first bit; -1: bit by bit).
    bits: list[int]
    block: int
    header: bool = True  # this round reads its header too


@dataclass(slots=True)
class Check:
    """One element's check on a grown or windowed shard: its reads, then maybe its add."""

    shard: int
    h1: int
    h2: int
    known: _Shard
    keys: list[_Key]
    reads: list[bytes]  # packed, ``TIME`` first where the round reads the clock
    #: The window it chose its keys by (-1: none), and whether it reads the clock.
    window: int
    asked: bool
    #: The generations of the window before it reads (what this worker knew at the plan).
    before: int
    #: The bits the read found unset in the newest generation (as ``_Key.bits``).
    unset: list[int] = field(default_factory=list)
    #: The add (once :meth:`StackPath.judge` said :data:`ADD`), its key and absolute bits.
    add: bytes = b""
    add_key: str = ""
    add_bits: list[int] = field(default_factory=list)
    #: Items the add sends to the count; whether it reads the state; else the count command.
    sent: int = 0
    stated: bool = False
    count: bytes = b""
    #: For an add that landed in a sealed generation: the next one's add, key and bits.
    again: bytes = b""
    again_key: str = ""
    again_bits: list[int] = field(default_factory=list)

    def give_back(self) -> None:
        """Keep the count its add carried for a later add: this one surely did not run."""
        self.known.pending += self.sent

    def add_undone(self) -> None:
        """Keep a count the add held inside it, and unjudge its element: the add did not land."""
        if self.stated:
            self.give_back()
        self.unjudge()

    def unjudge(self) -> None:
        """Take back the count of this element, counted new when judged: it was not added."""
        self.known.pending -= 1  # below 0 when sent already: the next send is one less


@dataclass(eq=False)
class StackPath:
    """Packs and reads the scriptless checks of grown and windowed shards (module doc)."""

    growth: Growth
    key: str
    identity: Callable[[int], bytes]
    workers: Callable[[], int] = lambda: 1
    _shards: dict[int, _Shard] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.shards, self.ttl = self.growth.spec.shards, self.growth.ttl
        self.gens: list[Generation] = self.growth.generations
        self.last = len(self.gens)

    @staticmethod
    def applies(growth: Growth) -> bool:
        """Tell whether a filter may use this path: it grows, or it has windows."""
        return bool(growth.expansion or growth.ttl)

    def plan(self, h1: int, h2: int) -> Check | None:
        """Return the reads of an element's check; None when the script must check it."""
        shard = h1 % self.shards
        known = self._shards.get(shard)
        if known is None:
            known = self._shards[shard] = _Shard(now=1 if self.ttl else 2, since=HEADER_EVERY)
        window, asked, before = -1, False, 0
        if self.ttl:
            window, asked = known.clock.estimate(self.ttl)
            if window != known.window:
                known.window, known.before, known.now, known.count = window, 1, 1, 0
                known.since = HEADER_EVERY
                known.pending = 0  # the old window's newest generation takes no more adds
            if known.before == -1 or not 0 < known.now <= self.last:
                return None
            before = known.before
            keys = self._keys(shard, h1, h2, before, window - 1, False)
            keys += self._keys(shard, h1, h2, known.now, window, True)
            reads = [TIME] if asked else []
        else:
            if not 1 < known.now <= self.last:
                return None
            keys = self._keys(shard, h1, h2, known.now, -1, True)
            reads = []
        known.since += 1
        every = known.since >= HEADER_EVERY
        if every:
            known.since = 0
        for k in keys:
            k.header = every  # the state comes with the add (:meth:`_pack_add`)
        reads += self._reads(keys)
        return Check(shard, h1, h2, known, keys, reads, window, asked, before)

    def _keys(
        self, shard: int, h1: int, h2: int, generations: int, window: int, current: bool
    ) -> list[_Key]:
        """Return the keys of a shard (or of one window of it) and the element's bits there."""
        last = generations - 1
        return [self._key(shard, h1, h2, g, window, current, g == last) for g in range(last + 1)]

    def _key(
        self, shard: int, h1: int, h2: int, g: int, window: int, current: bool, newest: bool
    ) -> _Key:
        gen = self.gens[g]
        q = h1 // self.shards
        if g == 0:
            x, y = q % self.growth.spec.shard_bits, h2 % gen.seed_range
        else:
            x, y = (q % WIDE) % gen.bits, (h2 % WIDE) % gen.seed_range
        bits = offsets(x, y, gen.hash_count, gen.bits, gen.block_bits, HEADER_BITS)
        block = -1
        if gen.block_bits:  # read the element's block whole: its bits counted from there
            block = HEADER_BITS + (bits[0] - HEADER_BITS) // gen.block_bits * gen.block_bits
            bits = [bit - block for bit in bits]
        if window < 0:
            name = layout.shard_key(self.key, shard, g)
        else:
            name = window_key(self.key, shard, window, g)
        return _Key(name, g, current, current and newest, bits, block)

    def _reads(self, keys: list[_Key]) -> list[bytes]:
        """Pack the reads of keys: the element's bits, then (where asked) the key's header."""
        reads = []
        for k in keys:
            if k.block < 0:
                args: list[Any] = [b"BITFIELD_RO", k.name, b"GET", b"i64", ID_FIELD]
                for bit in k.bits:
                    args += (b"GET", b"u1", bit)
                reads.append(pack_command(*args))
            else:
                first = k.block // 8
                last = first + self.gens[k.generation].block_bits // 8 - 1
                reads.append(pack_command(b"GETRANGE", k.name, first, last))
            if k.header:
                reads.append(_header(k.name))
        return reads

    def _near(self, known: _Shard) -> bool:
        """Tell whether the newest generation is too near its capacity (the script's)."""
        g = known.now - 1
        if not 0 <= g < self.last:
            return True
        # The counts workers may hold back: at most these few more than its capacity.
        late = STATE_EVERY * (self.workers() + 1)
        return known.count + known.pending + 1 >= self.gens[g].capacity - late

    def judge(self, check: Check, replies: list[Any], sent_at: float) -> str:
        """Read a check's reads (sent at ``sent_at``): :data:`SEEN`, :data:`ADD`, :data:`SCRIPT`."""
        known = check.known
        late = False
        if self.ttl:
            timed = known.timed(replies, check.asked, sent_at, check.window, self.ttl)
            if timed is None:
                # The keys were another window's: the next round reads the headers.
                if any(k.header for k in check.keys):
                    known.since = HEADER_EVERY
                return SCRIPT
            now, replies = timed
            late = not Clock.inside(now, check.window, self.ttl)
        if len(replies) != len(check.keys) + sum(k.header for k in check.keys):
            raise ValueError(f"replies to {len(check.reads)} reads, got {len(replies)}")
        identity = self.identity(check.shard)
        expected = id_field(identity)
        sound, seen, at = True, False, 0
        for k in check.keys:
            bits, at = replies[at], at + 1
            head = None
            if k.header:
                head, at = replies[at], at + 1
            # Missing (reads empty), or not this filter's: the script sorts it out.
            if k.block < 0:
                ours = isinstance(bits, list) and bool(bits) and bits[0] == expected
            else:
                ours = (
                    isinstance(bits, bytes) and len(bits) * 8 == self.gens[k.generation].block_bits
                )
            if head is not None:
                ours = ours and isinstance(head, bytes) and head[:IDENTITY_BYTES] == identity
            if not ours:
                sound = False
                missing = head == b"" or bits == b"" or (isinstance(bits, list) and bits[:1] == [0])
                if k.generation == 0 and not k.current and missing:
                    known.before = -1  # never started, or lost: only the script can tell
                continue
            if k.generation == 0 and head is not None:
                # The state: generations (u16, 0 reads as 1), the newest one's count (u32).
                generations = max(int.from_bytes(head[26:28], "big"), 1)
                if not k.current:
                    if generations != known.before:
                        known.before, sound = generations, False
                elif generations != known.now:
                    known.now, sound = generations, False
                    known.count = int.from_bytes(head[28:32], "big")
                else:  # never below what this worker sent since (a batch's adds land later)
                    known.count = max(known.count, int.from_bytes(head[28:32], "big"))
            if not seen:
                unset = _unset(bits[1:] if k.block < 0 else bits, k)
                seen = not unset
                if k.newest:
                    check.unset = unset
        if seen:
            return SEEN
        # Planned before its batch found the shard grown: its add would go to a sealed one,
        # or it read fewer generations of the window before than the first check's headers say.
        stale = check.keys[-1].generation + 1 != known.now or (
            self.ttl > 0 and check.before != known.before
        )
        if not sound or late or stale or self._near(known):
            return SCRIPT
        self._pack_add(check)
        known.pending += 1  # new, unless its add finds otherwise (:meth:`added`)
        return ADD

    def _pack_add(self, check: Check) -> None:
        """Pack the add: ``BITFIELD <newest> GET i64 32 [INCRBY u48 208 n] SET u1 <o> 1 ...``.

        The count goes by the add's ``INCRBY`` on a generation 0, else by a second command
        once :data:`STATE_EVERY` - 1 are held. Only bits found unset are set: the reply
        tells as surely whether this add set any.
        """
        known = check.known
        k = next(k for k in check.keys if k.newest)
        if k.generation == 0:
            check.sent = max(known.pending, 0)
            known.pending -= check.sent
            head: tuple[Any, ...] = (b"INCRBY", b"u48", GENERATIONS_BIT, check.sent)
            check.stated = True
        else:
            head = _SEAL  # its seal, once a later one started
            if known.pending >= STATE_EVERY - 1:  # else held, as the margin allows
                check.sent = known.pending
                known.pending = 0
                g0 = next(g for g in check.keys if g.current and g.generation == 0)
                command = (b"BITFIELD", g0.name, b"INCRBY", b"u48", GENERATIONS_BIT, check.sent)
                check.count = pack_command(*command)
        known.count += check.sent  # there once the add lands (its reply tells the count)
        check.add, check.add_bits = _pack_set(k.name, head, k.block, check.unset)
        check.add_key = k.name

    def added(self, check: Check, reply: Any) -> bool | None:
        """Read the add's reply: True for "seen", False for new; None: the key is not ours.

        New to a generation sealed meanwhile: :attr:`Check.again` adds it to the next one,
        where only one of the adds can find bits unset.
        """
        known = check.known
        seen = _were_set(reply, len(check.add_bits), id_field(self.identity(check.shard)))
        if seen is None:
            check.add_undone()  # it went to the wrong key
            return None
        if seen:
            check.unjudge()
        newest = next(key for key in check.keys if key.newest)
        if check.stated:
            generations, known.count = divmod(reply[1], 1 << 32)
            # Grown meanwhile: what this worker owes goes to the next (early, never late).
            known.now = max(generations, 1)
            sealed = generations > 1
        else:
            sealed = reply[1] != 0
        if sealed and not seen and newest.generation + 1 < self.last:
            after = newest.generation + 1
            known.now = max(known.now, after + 1)
            window = check.window if self.ttl else -1
            nxt = self._key(check.shard, check.h1, check.h2, after, window, True, True)
            check.again, check.again_bits = _pack_set(nxt.name, _SEAL, nxt.block, nxt.bits)
            check.again_key = nxt.name
        return seen

    def looked(self, check: Check, reply: Any) -> bool | None:
        """Read :attr:`Check.again`'s reply (as :meth:`added`; "seen" takes its count back)."""
        seen = _were_set(reply, len(check.again_bits), id_field(self.identity(check.shard)))
        if seen:
            check.unjudge()
        return seen

    def counted(self, check: Check, reply: Any) -> None:
        """Read the reply of an add's state command: the shard's state (a failure: give back)."""
        if reply is None or isinstance(reply, BaseException):
            check.give_back()
        elif isinstance(reply, list) and len(reply) == 1 and isinstance(reply[0], int):
            generations, count = divmod(reply[0], 1 << 32)
            check.known.now, check.known.count = max(generations, 1), count

    def scripted(self, shard: int, generations: int) -> None:
        """Note the generations the script found (and that a missing window before is absent)."""
        known = self._shards.get(shard)
        if known is None:
            return
        if generations:
            known.now = generations
        if known.before == -1 and known.clock.settled(self.ttl) == known.window:
            known.before = 0

    def flushes(self, only: int | None = None) -> list[tuple[int, str, bytes, int]]:
        """Return ``(shard, key, command, items)`` per shard with items still to count."""
        out = []
        for shard, known in self._shards.items():
            if (only is None or shard == only) and known.pending > 0:
                n, known.pending = known.pending, 0
                if self.ttl and not Clock.inside(known.clock.now(), known.window, self.ttl):
                    continue  # a past window takes no adds; its key may be gone: write nothing
                if self.ttl:
                    key = window_key(self.key, shard, known.window, 0)
                else:
                    key = layout.shard_key(self.key, shard)
                command = pack_command(b"BITFIELD", key, b"INCRBY", b"u48", GENERATIONS_BIT, n)
                out.append((shard, key, command, n))
        return out

    def give_back(self, shard: int, items: int) -> None:
        """Keep counts a flush could not send for the next one."""
        known = self._shards.get(shard)
        if known is not None:
            known.pending += items


def _pack_set(
    name: str, head: tuple[Any, ...], block: int, bits: list[int]
) -> tuple[bytes, list[int]]:
    """Pack ``BITFIELD <name> GET i64 32 <head> SET u1 <bit> 1 ...`` (bits from ``block``)."""
    bits = [bit + block for bit in bits] if block >= 0 else list(bits)
    args: list[Any] = [b"BITFIELD", name, b"GET", b"i64", ID_FIELD, *head]
    fill: list[int] = []
    for bit in bits:
        fill += (len(str(bit)), bit)
    ops = (SET_BIT * len(bits) % tuple(fill)).encode("latin-1")
    return command_head(len(args) + 4 * len(bits), *args) + ops, bits


def _header(name: str) -> bytes:
    """Pack ``GETRANGE <name> 0 31``: a key's header."""
    key = name.encode()
    return b"*4\r\n$8\r\nGETRANGE\r\n$%d\r\n%b\r\n" % (len(key), key) + _HEADER


def _unset(reply: Any, k: _Key) -> list[int]:
    """Return the element's bits a read found unset (none: every bit set), as ``k.bits``."""
    if k.block < 0:
        if not isinstance(reply, list) or len(reply) != len(k.bits):
            raise ValueError(f"a BITFIELD_RO of {len(k.bits)} fields, got {reply!r:.200}")
        return [bit for bit, value in zip(k.bits, reply, strict=True) if not value]
    if not isinstance(reply, bytes):
        raise ValueError(f"a GETRANGE's bytes, got {reply!r:.200}")
    top = 8 * len(reply) - 1
    value = int.from_bytes(reply, "big")
    # A missing (or short) key reads short: its header says so too.
    return [bit for bit in k.bits if bit > top or not value >> (top - bit) & 1]

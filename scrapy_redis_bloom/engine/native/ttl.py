"""Re-crawl windows (``BLOOMFILTER_TTL``) on the native backend: one Bloom filter per window.

Shard ``i``'s anchor ``{KEY:<i>}:bf:<id>`` holds ``"<newest window> <0|1>"`` (whether the
window before existed) and never expires, so a window lost is told from one never started;
each window ``...:w<w>`` is made by its first add and expires at ``(w + 2) T``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scrapy_redis_bloom.core.layout import NATIVE_TYPE
from scrapy_redis_bloom.engine.clock import TIME, Clock, Known
from scrapy_redis_bloom.engine.scripts import declare, lua
from scrapy_redis_bloom.transport.wire import Script, pack_command

#: What a new shard's anchor holds: no window started yet.
EMPTY_ANCHOR = "-1 0"
#: Reply codes of :data:`CHECK` (its first item) besides flags >= 0, and a flag.
ANCHOR_LOST = -1
FOREIGN = -2
WINDOW_LOST = -3
WRONG_WINDOW = -4  # a live window's key holds another type (another program wrote it)
RECREATED = 1  # a lost window was passed over (BLOOMFILTER_ON_LOSS = "recreate")

#: Check (and add) items in a shard's live windows. Reply: ``{flags, answer...}`` (1: seen in
#: a live window), or ``{ANCHOR_LOST}``, ``{FOREIGN}``, ``{WINDOW_LOST, key}``,
#: ``{WRONG_WINDOW, key}``.
CHECK = Script(
    declare(
        ANCHOR_LOST=ANCHOR_LOST,
        FOREIGN=FOREIGN,
        WINDOW_LOST=WINDOW_LOST,
        WRONG_WINDOW=WRONG_WINDOW,
        RECREATED=RECREATED,
        NATIVE_TYPE=NATIVE_TYPE,
    )
    + lua("windows")
    + lua("native_windows")
)

CREATE_ANCHOR = Script(declare(EMPTY_ANCHOR=EMPTY_ANCHOR) + lua("create_anchor"))
DELETE_TYPED = Script(lua("delete_typed"))


def window_key(anchor: str, window: int) -> str:
    """Return the key of a shard's window ``window`` (``anchor`` the shard's key)."""
    return f"{anchor}:w{window}"


#: What a read round decided (see :meth:`Windows.judge`).
SEEN, ADD, SCRIPT = "seen", "add", "script"
#: A shard's checks between two that make sure its window before still exists (``TYPE``).
EXISTS_EVERY = 16
#: ``TYPE``'s reply for a window: a Bloom filter.
BLOOM_TYPE = NATIVE_TYPE.encode()


@dataclass
class _Shard(Known):
    """What this worker knows of a shard's windows (``since``: checks since ``TYPE``)."""

    #: The window before: 1 there, 0 never started, -1 not known, -2 missing (the script's).
    before: int = -1


@dataclass(slots=True)
class WindowCheck:
    """One element's check without the script: its reads, then maybe its add."""

    shard: int
    window: int
    reads: list[bytes]
    asked: bool  # the round reads the clock (TIME first)
    exists: bool  # the round reads the window before's type (TYPE, then the BF.EXISTS)
    add: bytes = b""


class Windows:
    """Checks a native filter's live windows without :data:`CHECK` where it can.

    The windows' keys carry the filter's id, so plain commands suffice unless a window must
    be started or was found missing: ``BF.EXISTS`` in both, then ``BF.INSERT ... NOCREATE``,
    whose reply decides between racing workers. ``anchor(i)``: a shard's anchor key.
    """

    def __init__(self, ttl: int, anchor: Callable[[int], str]) -> None:
        self.ttl = ttl
        self.anchor = anchor
        self._shards: dict[int, _Shard] = {}

    def plan(self, shard: int, item: bytes) -> WindowCheck | None:
        """Return an item's reads (none: its add alone); None when the script must check it."""
        known = self._shards.get(shard)
        if known is None:
            known = self._shards[shard] = _Shard()
        window, asked = known.clock.estimate(self.ttl)
        if window != known.window:
            known.window, known.before = window, -1
        if known.before == -2:
            return None
        anchor = self.anchor(shard)
        current = window_key(anchor, window)
        if not known.before and not asked:  # no window before, the clock settled: add alone
            add = pack_command(b"BF.INSERT", current, b"NOCREATE", b"ITEMS", item)
            return WindowCheck(shard, window, [], False, False, add)
        reads = [TIME] if asked else []
        exists = False
        if known.before:
            before = window_key(anchor, window - 1)
            known.since += 1
            if known.before == -1 or known.since >= EXISTS_EVERY:
                known.since, exists = 0, True
                reads.append(pack_command(b"TYPE", before))
            reads.append(pack_command(b"BF.EXISTS", before, item))
        reads.append(pack_command(b"BF.EXISTS", current, item))
        return WindowCheck(shard, window, reads, asked, exists)

    def judge(self, check: WindowCheck, replies: list[Any], sent_at: float, item: bytes) -> str:
        """Judge a check's replies: :data:`SEEN`, :data:`ADD` (packed) or :data:`SCRIPT`."""
        known = self._shards[check.shard]
        if len(replies) != len(check.reads):
            raise ValueError(f"{len(check.reads)} replies, got {len(replies)}")
        timed = known.timed(replies, check.asked, sent_at, check.window, self.ttl)
        if timed is None:
            return SCRIPT  # the round chose its keys by another window
        now, replies = timed
        if check.exists:  # TYPE: BF.EXISTS answers 0 on another type, whatever it held
            if replies[0] not in (b"none", BLOOM_TYPE):
                return SCRIPT  # the script refuses it, naming it
            replies = [int(replies[0] == BLOOM_TYPE), *replies[1:]]
        if not all(reply in (0, 1) for reply in replies):
            raise ValueError(f"TYPE and BF.EXISTS replies, got {replies!r:.200}")
        seen = replies[-1] == 1
        if check.exists:
            if replies[0] == 0:  # the window before is missing: lost, or never started
                known.before = -2
                return SEEN if seen else SCRIPT
            known.before = 1
        if seen or (known.before > 0 and replies[-2] == 1):
            return SEEN
        if not Clock.inside(now, check.window, self.ttl):
            return SCRIPT  # the script starts the next window
        current = window_key(self.anchor(check.shard), check.window)
        check.add = pack_command(b"BF.INSERT", current, b"NOCREATE", b"ITEMS", item)
        return ADD

    def scripted(self, shard: int) -> None:
        """Note :data:`CHECK` answered: a missing window before is no loss (clock permitting)."""
        known = self._shards.get(shard)
        if (
            known is not None
            and known.before == -2
            and known.clock.settled(self.ttl) == known.window
        ):
            known.before = 0

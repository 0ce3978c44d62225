"""Redis's clock, as a shard's node last told it: which re-crawl window a check is in.

Scriptless checks keep, per shard, Redis's clock minus this machine's, read again after
:data:`CLOCK_EVERY` or near a window's edge, where a check goes to the script.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from scrapy_redis_bloom.transport.wire import pack_command

#: Seconds an offset is used before a round reads ``TIME`` again.
CLOCK_EVERY = 1.0
#: Seconds near a window's edges where the estimate is not trusted alone: more than the
#: time between a round's ``TIME`` and the add that follows it reaching Redis.
GUARD = 1.0
TIME = pack_command(b"TIME")


@dataclass
class Clock:
    """Redis's clock minus this machine's, for one shard (its node keeps its own time)."""

    offset: float = 0.0
    #: ``time.monotonic()`` of the last ``TIME`` read (-inf: never).
    sampled: float = -math.inf

    def estimate(self, ttl: int) -> tuple[int, bool]:
        """Return the window Redis is in, by the offset, and whether to read ``TIME`` now."""
        now = time.time() + self.offset
        window = int(now // ttl)
        into = now - window * ttl
        stale = time.monotonic() - self.sampled > CLOCK_EVERY
        return window, stale or into < GUARD or into > ttl - GUARD

    def settled(self, ttl: int) -> int | None:
        """Return the window Redis is in by the offset, however old; None near its edges."""
        now = time.time() + self.offset
        window = int(now // ttl)
        return window if GUARD <= now - window * ttl <= ttl - GUARD else None

    def read(self, reply: Any, sent_at: float) -> float:
        """Take a ``TIME`` reply of a round sent at ``sent_at``; return it (ValueError if bad)."""
        if not isinstance(reply, list) or len(reply) != 2:
            raise ValueError(f"TIME replies two numbers, got {reply!r:.100}")
        now = int(reply[0]) + int(reply[1]) / 1e6
        self.offset, self.sampled = now - sent_at, time.monotonic()
        return now

    def now(self) -> float:
        """Return Redis's time by the offset."""
        return time.time() + self.offset

    @staticmethod
    def inside(now: float, window: int, ttl: int) -> bool:
        """Tell whether ``now`` is in ``window`` and not within :data:`GUARD` of its end."""
        return window * ttl <= now <= (window + 1) * ttl - GUARD


@dataclass
class Known:
    """What a scriptless windowed path (:mod:`.stackpath`, :mod:`.native.ttl`) knows of a shard."""

    #: The window this is known for (-1 without windows).
    window: int = -1
    since: int = 0
    clock: Clock = field(default_factory=Clock)

    def timed(
        self, replies: list[Any], asked: bool, sent_at: float, window: int, ttl: int
    ) -> tuple[float, list[Any]] | None:
        """Return Redis's time at a round's reads and the rest (None: not Redis's window now)."""
        if asked:
            now, replies = self.clock.read(replies[0], sent_at), replies[1:]
        else:
            now = self.clock.now()
        if int(now // ttl) != window or self.window != window:
            return None
        return now, replies

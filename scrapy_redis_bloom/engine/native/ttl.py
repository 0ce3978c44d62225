"""Re-crawl windows (``BLOOMFILTER_TTL``) on the native backend: one Bloom filter per window.

Time is cut into windows ``w = floor(Redis TIME / T)``, as for a bitmap filter (see
:mod:`.generations`). Shard ``i`` of a native filter with a TTL is:

* ``{KEY:<i>}:bf:<id>``, its anchor: a string ``"<newest window> <0|1>"``, the newest
  window started and whether the window before it existed then (``-1 0`` before any).
  It never expires, so a window that is missing although it was started is told from
  one never started: that one was lost (evicted, deleted), not forgotten;
* ``{KEY:<i>}:bf:<id>:w<w>``: a RedisBloom filter per window, created by the first add
  of that window, expiring at ``(w + 2) T``.

:data:`CHECK` consults windows w - 1 and w and adds to w, in one script call (one
round trip, atomic): an element added at time t is found until the end of window
w + 1 (at least T after t), and forgotten when that window expires (at most 2T).
Each window is created for half the error rate (two are consulted).

The window arithmetic (which window is current, which must exist, when the anchor
moves on) is the bitmap backend's too: one Lua function, ``lua/windows.lua``. Only the
anchor's encoding differs, and stays as filters already store it: this text here, the
two numbers in the shard's header there (the bitmap shard's header is its identity,
checked by everything that opens a shard, and a worker of an older version reading
the other encoding would take its filter for a foreign one).
"""

from __future__ import annotations

from typing import Any

from scrapy_redis_bloom.engine.scripts import declare, lua
from scrapy_redis_bloom.transport.wire import Script

#: What a new shard's anchor holds: no window started yet.
EMPTY_ANCHOR = "-1 0"
#: Reply codes of :data:`CHECK` (its first item) besides flags >= 0.
ANCHOR_LOST = -1
FOREIGN = -2
WINDOW_LOST = -3
#: Flag: a lost window was passed over (``BLOOMFILTER_ON_LOSS = "recreate"``).
RECREATED = 1

#: Check (and add) items in a shard's live windows (``lua/native_windows.lua``, on the
#: window model of ``lua/windows.lua`` it shares with the bitmap backend). ``KEYS[1]``
#: the anchor; ARGV: the TTL, BF.RESERVE's rate and capacity, the expansion (0:
#: NONSCALING), ``1`` to go on past a lost window, ``w`` to add or ``r`` to only check,
#: then the items. Reply: ``{flags, answer...}`` with 1 for "seen in a live window"; or
#: ``{ANCHOR_LOST}``, ``{FOREIGN}``, ``{WINDOW_LOST, key}``.
CHECK = Script(
    declare(ANCHOR_LOST=ANCHOR_LOST, FOREIGN=FOREIGN, WINDOW_LOST=WINDOW_LOST, RECREATED=RECREATED)
    + lua("windows")
    + lua("native_windows")
)

#: Create a shard's anchor unless the key exists; reply with its type then.
CREATE_ANCHOR = Script(declare(EMPTY_ANCHOR=EMPTY_ANCHOR) + lua("create_anchor"))

#: Delete a shard's anchor or window only if it is still of the type given.
DELETE_TYPED = Script(lua("delete_typed"))


def window_key(anchor: str, window: int) -> str:
    """Return the key of a shard's window ``window`` (``anchor`` the shard's key)."""
    return f"{anchor}:w{window}"


def check_arguments(
    ttl: int, rate: float, capacity: int, expansion: int, recreate: bool, write: bool
) -> tuple[Any, ...]:
    """Return :data:`CHECK`'s arguments before the items."""
    return (
        ttl,
        repr(rate),
        capacity,
        expansion,
        b"1" if recreate else b"0",
        b"w" if write else b"r",
    )

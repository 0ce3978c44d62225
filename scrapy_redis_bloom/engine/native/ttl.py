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
"""

from __future__ import annotations

from typing import Any

from scrapy_redis_bloom.transport.wire import Script

#: What a new shard's anchor holds: no window started yet.
EMPTY_ANCHOR = "-1 0"
#: Reply codes of :data:`CHECK` (its first item) besides flags >= 0.
ANCHOR_LOST = -1
FOREIGN = -2
WINDOW_LOST = -3
#: Flag: a lost window was passed over (``BLOOMFILTER_ON_LOSS = "recreate"``).
RECREATED = 1

#: Check (and add) items in a shard's live windows. ``KEYS[1]`` the anchor; ARGV: the
#: TTL, BF.RESERVE's rate and capacity, the expansion (0: NONSCALING), ``1`` to go on
#: past a lost window, ``w`` to add or ``r`` to only check, then the items. Reply:
#: ``{flags, answer...}`` with 1 for "seen in a live window"; or ``{ANCHOR_LOST}``,
#: ``{FOREIGN}``, ``{WINDOW_LOST, key}``.
CHECK = Script(f"""
local anchor = KEYS[1]
local ttl = tonumber(ARGV[1])
local state = redis.call('GET', anchor)
if not state then return {{{ANCHOR_LOST}}} end
local newest, before = string.match(state, '^(-?%d+) ([01])$')
if not newest then return {{{FOREIGN}}} end
newest, before = tonumber(newest), tonumber(before)
local w = math.floor(tonumber(redis.call('TIME')[1]) / ttl)
local cur, prev = anchor .. ':w' .. w, anchor .. ':w' .. (w - 1)
local flags = 0
local has_prev = redis.call('EXISTS', prev) == 1
if not has_prev and (newest == w - 1 or (newest == w and before == 1)) then
  if ARGV[5] ~= '1' then return {{{WINDOW_LOST}, prev}} end
  flags = {RECREATED}
end
local has_cur = redis.call('EXISTS', cur) == 1
if not has_cur and newest >= w then
  if ARGV[5] ~= '1' then return {{{WINDOW_LOST}, cur}} end
  flags = {RECREATED}
end
local write = ARGV[6] == 'w'
if write and not has_cur then
  if ARGV[4] == '0' then
    redis.call('BF.RESERVE', cur, ARGV[2], ARGV[3], 'NONSCALING')
  else
    redis.call('BF.RESERVE', cur, ARGV[2], ARGV[3], 'EXPANSION', ARGV[4])
  end
  redis.call('EXPIREAT', cur, (w + 2) * ttl)
  if newest < w then redis.call('SET', anchor, w .. ' ' .. (has_prev and 1 or 0)) end
  has_cur = true
end
local before_hits = has_prev and redis.call('BF.MEXISTS', prev, unpack(ARGV, 7)) or nil
local now_hits = nil
if write then
  now_hits = redis.call('BF.INSERT', cur, 'NOCREATE', 'ITEMS', unpack(ARGV, 7))
elseif has_cur then
  now_hits = redis.call('BF.MEXISTS', cur, unpack(ARGV, 7))
end
local out = {{flags}}
for i = 1, #ARGV - 6 do
  local seen = before_hits ~= nil and before_hits[i] == 1
  if now_hits ~= nil then
    if write then seen = seen or now_hits[i] == 0 else seen = seen or now_hits[i] == 1 end
  end
  out[i + 1] = seen and 1 or 0
end
return out
""")

#: Create a shard's anchor unless the key exists; reply with its type then.
CREATE_ANCHOR = Script(f"""
if redis.call('SET', KEYS[1], '{EMPTY_ANCHOR}', 'NX') then return 'created' end
return redis.call('TYPE', KEYS[1])['ok']
""")

#: Delete a shard's anchor or window only if it is still of the type given.
DELETE_TYPED = Script("""
if redis.call('TYPE', KEYS[1])['ok'] ~= ARGV[1] then return 0 end
return redis.call('UNLINK', KEYS[1])
""")


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

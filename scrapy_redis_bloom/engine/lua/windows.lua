-- Re-crawl windows (BLOOMFILTER_TTL), the one model of both backends: see
-- core/generations.py. A window the anchor shows was started, and not yet expired, must
-- exist: missing, it was lost (evicted or deleted), not forgotten.
-- Returns w; whether windows w - 1 and w must exist; whether an add moves the anchor on
-- to w (never back, should the server's clock step back); when window w's keys expire.
local function window_plan(ttl, newest, before)
  local w = math.floor(tonumber(redis.call('TIME')[1]) / ttl)
  local need_prev = newest == w - 1 or (newest == w and before == 1)
  local need_cur = newest == w or (newest == w + 1 and before == 1)
  return w, need_prev, need_cur, newest < w, (w + 2) * ttl
end

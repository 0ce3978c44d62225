-- Where the shard's bits are, without re-crawl windows: the shard itself, KEYS[1]
-- ({KEY:<i>}:g0), and its later generations {KEY:<i>}:g1 ...
cur = {base = string.sub(KEYS[1], 1, -2)}
if not load(cur, true, false, true) then return {MISMATCH, bad} end
views = {cur}

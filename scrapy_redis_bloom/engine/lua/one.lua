-- The hot path's body: check (and add) the one element of the call, its bits set with
-- SETBIT (k cheap calls). Reply {0, flags, generations, answer}. Its parts are included
-- as text (no function to create per call).
local e = 4
--@ grow
local seen
--@ found
if not seen and write then
  local g = cur.G - 1
  local key = cur.base .. g
  local all = 1
  local x, y = seeds(g, e)
  offsets(x, y, K[g + 1], B[g + 1], H, at)
  for i = 1, K[g + 1] do
    if redis.call('SETBIT', key, at[i], '1') == 0 then all = 0 end
  end
  seen = all == 1
  if not seen then cur.count, cur.dirty = cur.count + 1, true end
end
--@ save
return {0, flags, cur.G or 0, seen and 1 or 0}

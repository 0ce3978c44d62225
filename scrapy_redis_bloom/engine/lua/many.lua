-- The bulk path's body: check (and add) the elements of the call, in batches, the bits
-- of many set in a few BITFIELD calls. Reply {0, flags, generations, answer...}.
-- Set the bits of elements (ARGV positions in ``batch``) in generation g, in BITFIELDs of
-- at most PER_BITFIELD elements; put whether all of each one's bits were set in ``seen``.
local PER_BITFIELD = math.floor(7000 / (4 * K[LAST]))
local function set(key, g, batch, seen)
  local k = K[g + 1]
  for first = 1, #batch, PER_BITFIELD do
    local last = math.min(first + PER_BITFIELD - 1, #batch)
    local args, n = {}, 0
    for b = first, last do
      local x, y = seeds(g, batch[b])
      offsets(x, y, k, B[g + 1], H, at)
      for i = 1, k do
        args[n + 1], args[n + 2], args[n + 3], args[n + 4] = 'SET', 'u1', at[i], '1'
        n = n + 4
      end
    end
    local old = redis.call('BITFIELD', key, unpack(args))
    for b = first, last do
      local all = true
      for i = (b - first) * k + 1, (b - first + 1) * k do
        if old[i] == 0 then all = false break end
      end
      seen[batch[b]] = all
    end
  end
end
-- Whether an element (ARGV from e) is in the older generations (see found.lua).
local function found(e)
  local seen
  --@ found
  return seen
end
local reply = {0, 0, 0}
local e = 4
-- Before any write, each generation this call may start (Redis calls only when it may grow):
-- a foreign key there is reported with nothing added, not half-way through.
if write and COUNTED then
  local left, g, room = (#ARGV - e + 1) / 4, cur.G, C[cur.G] - cur.count
  while left > room and g < LAST do
    if not takeable(cur.base .. g) then return {MISMATCH, bad} end
    left, g, room = left - math.max(room, 0), g + 1, C[g + 1]
  end
end
while e <= #ARGV do
  --@ grow
  -- A batch the newest generation has room for, even if every element is new: the
  -- next one may start a generation, exactly as one element at a time would.
  local room = #ARGV
  if write and COUNTED and cur.count < C[cur.G] then room = C[cur.G] - cur.count end
  local seen, batch = {}, {}
  local stop = math.min(#ARGV, e + 4 * room - 1)
  for i = e, stop, 4 do
    seen[i] = found(i)
    if not seen[i] then batch[#batch + 1] = i end
  end
  if write and #batch > 0 then
    set(cur.base .. (cur.G - 1), cur.G - 1, batch, seen)
    for _, i in ipairs(batch) do
      if not seen[i] then cur.count, cur.dirty = cur.count + 1, true end
    end
  end
  for i = e, stop, 4 do reply[#reply + 1] = seen[i] and 1 or 0 end
  e = stop + 1
end
--@ save
reply[2], reply[3] = flags, cur.G or 0
return reply

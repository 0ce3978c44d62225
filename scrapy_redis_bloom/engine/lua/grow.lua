-- Included (--@ grow): start the next generation when the newest is full (before
-- writing to it). A foreign key where it goes is reported before any write (many.lua
-- checks the generations it may start first).
if write and COUNTED and cur.count >= C[cur.G] then
  if cur.G < LAST then
    if not allocate(cur, cur.G) then return {MISMATCH, bad} end
    -- Seal the generation that was the newest (its header's state, unused after a
    -- generation 0): a scriptless add that lands there after this reads the seal and
    -- looks for its element in the new one (engine/bitmap/stackpath.py). Generation 0's
    -- seal is its count of generations, which save.lua writes.
    if cur.G > 1 then redis.call('SETRANGE', cur.base .. (cur.G - 1), IDENTITY_BYTES, '\128\0') end
    cur.G, cur.count, cur.dirty = cur.G + 1, 0, true
    flags = bit.bor(flags, GREW)
  else
    flags = bit.bor(flags, FULL)
  end
end

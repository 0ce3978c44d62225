-- Included (--@ grow): start the next generation when the newest is full (before
-- writing to it).
if write and COUNTED and cur.count >= C[cur.G] then
  if cur.G < LAST then
    allocate(cur.base .. cur.G, cur.G)
    cur.G, cur.count, cur.dirty = cur.G + 1, 0, true
    flags = bit.bor(flags, GREW)
  else
    flags = bit.bor(flags, FULL)
  end
end

-- Included (--@ save): write the newest generation's count back to its header, when it
-- changed.
if cur.dirty and COUNTED then
  redis.call('SETRANGE', cur.base .. '0', IDENTITY_BYTES,
    pack(cur.G, math.min(cur.count, 4294967295)))
end

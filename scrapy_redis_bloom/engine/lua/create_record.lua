-- Write the config record unless one exists; reply with the record in Redis. KEYS[1] the
-- record's key; ARGV field, value pairs, or none to only read it (an empty reply then
-- means there is no filter).
if #ARGV > 0 and redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV))
end
return redis.call('HGETALL', KEYS[1])

-- Delete a native shard's anchor or window only if it is still of the type given.
if redis.call('TYPE', KEYS[1])['ok'] ~= ARGV[1] then return 0 end
return redis.call('UNLINK', KEYS[1])

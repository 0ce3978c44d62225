-- Create a native shard's anchor unless the key exists; reply with its type then.
if redis.call('SET', KEYS[1], EMPTY_ANCHOR, 'NX') then return 'created' end
return redis.call('TYPE', KEYS[1])['ok']

-- What the check-and-add script, routed by a shard's key (KEYS[1]), sees of one of its
-- parts (ARGV[1]): its first ARGV[2] bytes. While the Cluster slot moves, the node the
-- shard key went to sees parts not moved yet as missing (engine/bitmap/filter.py).
return redis.call('GETRANGE', ARGV[1], 0, tonumber(ARGV[2]) - 1)

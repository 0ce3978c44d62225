-- Clear bits a scriptless check set in a shard that turned out not to be its filter's,
-- while the shard still carries the id the check found there (else it changed again).
-- KEYS[1] the shard; ARGV[1] the 8 bytes of its header at byte 4 the check found;
-- the other ARGV the bit offsets to clear.
if redis.call('GETRANGE', KEYS[1], 4, 11) ~= ARGV[1] then return 0 end
for i = 2, #ARGV do redis.call('SETBIT', KEYS[1], ARGV[i], 0) end
return 1

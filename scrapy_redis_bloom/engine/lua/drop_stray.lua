-- Delete a key that a scriptless add created where a generation or a window was missing
-- (it has no header), once no bit is left set in it (take_back.lua cleared the add's):
-- the script then finds the key missing, as it was, and reports or recreates it. A key
-- with a header, or with bits another add set meanwhile, is left alone.
if redis.call('GETRANGE', KEYS[1], 0, 31) ~= string.rep('\0', 32) then return 0 end
if redis.call('BITCOUNT', KEYS[1]) ~= 0 then return 0 end
redis.call('DEL', KEYS[1])
return 1

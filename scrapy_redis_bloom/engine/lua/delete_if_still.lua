-- Delete KEYS[1] only if it is still the filter's part it was proven to be: 1 if
-- deleted, 0 if it is something else (left alone). ARGV: the kind of part, the proof.
local key, kind, proof = KEYS[1], ARGV[1], ARGV[2]
local found = redis.call('TYPE', key)['ok']
if kind == 'shard' then
  if found ~= 'string' or redis.call('GETRANGE', key, 0, IDENTITY_BYTES - 1) ~= proof
  then return 0 end
elseif kind == 'native' then
  if found ~= proof then return 0 end
elseif kind == 'marker' then
  if found ~= 'string' or redis.call('GET', key) ~= proof then return 0 end
elseif kind == 'counters' then
  if found ~= 'hash' then return 0 end
  for _, field in ipairs(redis.call('HKEYS', key)) do
    if field ~= 'added' and field ~= 'seen' then return 0 end
  end
elseif kind == 'record' then
  if found ~= 'hash' then return 0 end
  if proof ~= '' then
    if redis.call('HGET', key, 'id') ~= proof then return 0 end
  elseif redis.call('HEXISTS', key, 'layout') == 0 or redis.call('HEXISTS', key, 'scheme') == 0
  then return 0 end
else
  return 0
end
return redis.call('UNLINK', key)

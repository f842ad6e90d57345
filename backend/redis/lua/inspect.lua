-- inspect: the current holder, read atomically.
-- KEYS[1] lock hash
-- Returns {owner, token, pttl, meta} (meta a nil reply when the record has
-- none), or an empty array if the key is free.
local cur = redis.call('HMGET', KEYS[1], 'owner', 'token', 'meta')
if not cur[1] then
  return {}
end
return {cur[1], cur[2], redis.call('PTTL', KEYS[1]), cur[3]}

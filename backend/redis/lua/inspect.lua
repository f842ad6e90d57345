-- inspect: the current holder, read atomically.
-- KEYS[1] lock hash
-- Returns {owner, token, pttl}, or an empty array if the key is free.
local cur = redis.call('HMGET', KEYS[1], 'owner', 'token')
if not cur[1] then
  return {}
end
return {cur[1], cur[2], redis.call('PTTL', KEYS[1])}

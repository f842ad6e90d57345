-- force: remove the lock whoever holds it (an administrator's tool).
-- KEYS[1] lock hash
-- ARGV[1] release channel
-- Returns {owner, token, pttl} of what was removed, or an empty array.
-- The counter is left alone, so the next grant's token is still higher.
local cur = redis.call('HMGET', KEYS[1], 'owner', 'token')
if not cur[1] then
  return {}
end
local pttl = redis.call('PTTL', KEYS[1])
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], 'forced')
return {cur[1], cur[2], pttl}

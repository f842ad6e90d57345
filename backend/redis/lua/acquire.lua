-- acquire: one attempt to take a lock.
-- KEYS[1] lock hash {owner, token}, with a TTL
-- KEYS[2] token counter (never expires)
-- ARGV[1] owner, ARGV[2] TTL in milliseconds
-- Returns the token (integer) on success, or {owner, token, pttl} of the
-- current holder. Expiry is judged by Redis itself: an expired hash reads as
-- missing.
local cur = redis.call('HMGET', KEYS[1], 'owner', 'token')
if cur[1] == ARGV[1] then
  -- A retry by the holder (an ambiguous earlier reply): same grant.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(cur[2])
end
if cur[1] then
  return {cur[1], cur[2], redis.call('PTTL', KEYS[1])}
end
local tok = redis.call('INCR', KEYS[2])
-- %d, not tostring: tostring would switch to exponent form past 1e14.
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', string.format('%d', tok))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return tok

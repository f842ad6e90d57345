-- renew: extend a grant that is still current; never creates a record.
-- KEYS[1] lock hash, KEYS[2] token counter
-- ARGV[1] owner, ARGV[2] token (decimal), ARGV[3] TTL in milliseconds,
-- ARGV[4] '1' to rotate the token
-- Returns the (possibly new) token, or 0 if the grant is not current.
local cur = redis.call('HMGET', KEYS[1], 'owner', 'token')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if ARGV[4] == '1' then
  local tok = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[1], 'token', string.format('%d', tok))
  return tok
end
return tonumber(cur[2])

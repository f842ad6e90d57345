-- release: delete the lock if owner and token match, and wake waiters.
-- KEYS[1] lock hash
-- ARGV[1] owner, ARGV[2] token (decimal), ARGV[3] release channel
-- Returns 1 if released, 0 if the grant is not current (nothing changed).
-- The counter is left alone, so the next grant's token is still higher.
local cur = redis.call('HMGET', KEYS[1], 'owner', 'token')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[3], 'released')
return 1

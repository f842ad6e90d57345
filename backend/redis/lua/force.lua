-- force: remove the lock whoever holds it (an administrator's tool).
-- KEYS[1] lock record "<token>\n<owner>\n<meta>", KEYS[2] lock-delay
-- marker (see acquire.lua), removed too: a forced release frees at once
-- ARGV[1] release channel
-- Returns {owner, token, pttl} of what was removed, or an empty array.
-- The counter is left alone, so the next grant's token is still higher.
local cur = redis.call('GET', KEYS[1])
if not cur then
  return {}
end
local a = string.find(cur, '\n', 1, true)
local b = a and a <= 20 and string.find(cur, '\n', a + 1, true)
if not b or not string.find(string.sub(cur, 1, a - 1), '^[1-9]%d*$') then
  return redis.error_reply('FENCELOCK_BAD_RECORD the lock record is not <token>\\n<owner>\\n<meta>')
end
local pttl = redis.call('PTTL', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('PUBLISH', ARGV[1], 'forced')
return {string.sub(cur, a + 1, b - 1), string.sub(cur, 1, a - 1), pttl}

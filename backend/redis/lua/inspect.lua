-- inspect: the current holder, read atomically.
-- KEYS[1] lock record "<token>\n<owner>\n<meta>"
-- Returns {owner, token, pttl, meta} (meta a nil reply when the record has
-- none), or an empty array if the key is free.
local cur = redis.call('GET', KEYS[1])
if not cur then
  return {}
end
local a = string.find(cur, '\n', 1, true)
local b = a and a <= 20 and string.find(cur, '\n', a + 1, true)
if not b or not string.find(string.sub(cur, 1, a - 1), '^[1-9]%d*$') then
  return redis.error_reply('FENCELOCK_BAD_RECORD the lock record is not <token>\\n<owner>\\n<meta>')
end
local meta = false
if b < #cur then
  meta = string.sub(cur, b + 1)
end
return {string.sub(cur, a + 1, b - 1), string.sub(cur, 1, a - 1), redis.call('PTTL', KEYS[1]), meta}

-- renew: extend a grant that is still current; never creates a record.
-- KEYS[1] lock record "<token>\n<owner>\n<meta>", KEYS[2] token counter,
-- KEYS[3] lock-delay marker (see acquire.lua), which a renewal keeps its
-- lock delay past the record's new end
-- ARGV[1] owner, ARGV[2] token (decimal), ARGV[3] TTL in milliseconds,
-- ARGV[4] '1' to rotate the token, ARGV[5] '1' to set the metadata to
-- ARGV[6] (empty: remove it); otherwise the metadata is kept
-- Returns the (possibly new) token as a decimal string, or 0 if the grant
-- is not current (nothing changed); an error reply
-- FENCELOCK_TOKEN_OVERFLOW, with nothing changed, if a rotation finds the
-- counter at 2^63-1.
--
-- Tokens never pass through a Lua number (a double) where it is not exact:
-- INCR counts exactly in C; its reply is used as a number only below 2^53,
-- and read back with GET, as a string, above.
local cur = redis.call('GET', KEYS[1])
local head = ARGV[2] .. '\n' .. ARGV[1] .. '\n'
if not cur or string.sub(cur, 1, #head) ~= head then
  return 0
end
-- The record is rewritten below, after the check above and after anything
-- that can fail, by the same script: no read-then-write between them.
local meta
if ARGV[5] == '1' then
  meta = ARGV[6]
end
local tok = ARGV[2]
if ARGV[4] == '1' then
  -- INCR first: if it fails, nothing has been written.
  local r = redis.pcall('INCR', KEYS[2])
  if type(r) == 'table' and r.err then
    if string.find(r.err, 'overflow', 1, true) then
      return redis.error_reply('FENCELOCK_TOKEN_OVERFLOW the token counter is at 2^63-1')
    end
    return r
  end
  -- Exact below 2^53 as a number, read back as a string above (see
  -- acquire.lua).
  if r < 9007199254740992 then
    tok = string.format('%d', r)
  else
    tok = redis.call('GET', KEYS[2])
  end
end
-- Only the current holder's grant leaves a marker (a grant without a lock
-- delay deletes any).
local delay = tonumber(redis.call('GET', KEYS[3]) or '')
if delay then
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[3]) + delay)
end
if tok == ARGV[2] and not meta then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return tok
end
if not meta then
  meta = string.sub(cur, #head + 1)
end
redis.call('SET', KEYS[1], tok .. '\n' .. ARGV[1] .. '\n' .. meta, 'PX', ARGV[3])
return tok

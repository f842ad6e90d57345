-- acquire: one attempt to take a lock.
-- KEYS[1] lock record, a string "<token>\n<owner>\n<meta>", with a TTL
-- KEYS[2] token counter (never expires)
-- KEYS[3] lock-delay marker: the holder's lock delay in milliseconds, a
-- string, with a PX of the record's TTL plus that delay (set by a grant
-- with a lock delay, refreshed by renew.lua, deleted by a release), so it
-- outlives a record that expired by the holder's delay: while it does, the
-- record ended (pttl of the marker − the delay) ms ago, unreleased
-- ARGV[1] owner, ARGV[2] TTL in milliseconds, ARGV[3] metadata (any bytes;
-- empty: none), ARGV[4] the acquirer's lock delay in milliseconds ('0':
-- none)
-- Returns the token (a decimal string) on success, or {owner, token, pttl}
-- of the current holder, or {'DELAY', ms} while the key is in its lock
-- delay (ms left, by Redis's clock); an error reply FENCELOCK_TOKEN_OVERFLOW, with
-- nothing changed, if the counter is at 2^63-1. Expiry is judged by Redis
-- itself: an expired record reads as missing.
--
-- The record is split at its first two newlines: tokens are decimal
-- digits and owners have no control characters (driver.ValidateOwner), so
-- the metadata, any bytes, is everything after the second. A value whose
-- first line is not a token (1 to 19 digits, no leading zero) is not a
-- record this backend wrote: refused with FENCELOCK_BAD_RECORD before
-- anything is written (inspect.lua and force.lua check the same).
--
-- Tokens never pass through a Lua number (a double) where it is not exact:
-- INCR counts exactly in C; its reply is used as a number only below 2^53,
-- and read back with GET, as a string, above.
local cur = redis.call('GET', KEYS[1])
if cur then
  local a = string.find(cur, '\n', 1, true)
  local b = a and a <= 20 and string.find(cur, '\n', a + 1, true)
  if not b or not string.find(string.sub(cur, 1, a - 1), '^[1-9]%d*$') then
    return redis.error_reply('FENCELOCK_BAD_RECORD the lock record is not <token>\\n<owner>\\n<meta>')
  end
  local tok, owner = string.sub(cur, 1, a - 1), string.sub(cur, a + 1, b - 1)
  if owner == ARGV[1] then
    -- A retry by the holder (an ambiguous earlier reply): same grant, and
    -- the retry's metadata.
    redis.call('SET', KEYS[1], tok .. '\n' .. owner .. '\n' .. ARGV[3], 'PX', ARGV[2])
    if ARGV[4] ~= '0' then
      redis.call('SET', KEYS[3], ARGV[4], 'PX', tonumber(ARGV[2]) + tonumber(ARGV[4]))
    end
    return tok
  end
  return {owner, tok, redis.call('PTTL', KEYS[1])}
end
if ARGV[4] ~= '0' then
  -- No record: free, unless the last one expired (a release deletes the
  -- marker) less than this acquirer's delay ago.
  local held = tonumber(redis.call('GET', KEYS[3]) or '')
  local pttl = redis.call('PTTL', KEYS[3])
  if held and pttl > 0 then
    local left = pttl - held + tonumber(ARGV[4])
    if left > 0 then
      return {'DELAY', left}
    end
  end
end
local r = redis.pcall('INCR', KEYS[2])
if type(r) == 'table' and r.err then
  if string.find(r.err, 'overflow', 1, true) then
    return redis.error_reply('FENCELOCK_TOKEN_OVERFLOW the token counter is at 2^63-1')
  end
  return r
end
-- INCR's reply reaches Lua as a number (a double): exact below 2^53, so
-- formatted with %d there (no GET: one call fewer on every acquisition
-- for the next 2^53 tokens). From 2^53 on, where the double may be
-- rounded (monotonically: a value at or above 2^53 never reads below it),
-- the exact value is read back with GET, as a string.
local tok
if r < 9007199254740992 then
  tok = string.format('%d', r)
else
  tok = redis.call('GET', KEYS[2])
end
redis.call('SET', KEYS[1], tok .. '\n' .. ARGV[1] .. '\n' .. ARGV[3], 'PX', ARGV[2])
if ARGV[4] ~= '0' then
  redis.call('SET', KEYS[3], ARGV[4], 'PX', tonumber(ARGV[2]) + tonumber(ARGV[4]))
else
  redis.call('DEL', KEYS[3])
end
return tok

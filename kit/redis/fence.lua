-- fence.lua: fencelock's fencing rule inside Redis (kit/redis, package
-- redisfence). It checks a write's token against the resource's fence,
-- records it, and runs the write's commands, in one atomic step.
--
-- KEYS[1]    the fence, a hash {token, owner}: "{TAG}:fencelock:fence:RESOURCE"
-- KEYS[2..]  every command's keys, in order (all carrying {TAG})
-- ARGV[1]    the token, decimal ($FENCELOCK_TOKEN)
-- ARGV[2]    the holder ($FENCELOCK_OWNER)
-- ARGV[3]    N, the number of commands; then, for each command:
--            its name, its number of keys, its number of arguments, and
--            the arguments (its keys come from KEYS, in order)
--
-- Accepted: records the fence, runs the commands and returns
-- {1, reply of each command...}. Refused: changes nothing and returns the
-- error "STALE stale fencing token T (highest accepted H)". A command that
-- fails returns "FENCECMD command I failed ...: ERROR" (I counts from 0);
-- the fence and the commands before it have taken effect (Redis does not
-- roll back). Arguments that do not follow the layout return an "ERR"
-- error before anything is written.
--
-- From a shell, with redis-cli (KEYS, then a lone comma, then ARGV):
--   redis-cli -e --eval fence.lua '{acct:1}:fencelock:fence:acct:1' '{acct:1}:balance' , \
--     "$FENCELOCK_TOKEN" "$FENCELOCK_OWNER" 1 INCRBY 1 1 100
local function bad(why)
  return redis.error_reply('ERR fence.lua: ' .. why .. ': want KEYS fence, keys...; ARGV token, holder, N, then per command: name, number of keys, number of arguments, arguments')
end
if #KEYS < 1 or #ARGV < 3 then
  return bad('too few keys or arguments')
end
local n = tonumber(ARGV[3])
if not n or n < 0 or n % 1 ~= 0 then
  return bad('ARGV[3] is not a number of commands')
end
local a, k = 4, 2
for i = 1, n do
  local nk, na = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  if not nk or not na or nk < 0 or na < 0 or nk % 1 ~= 0 or na % 1 ~= 0 or ARGV[a] == '' then
    return bad('command ' .. (i - 1) .. ' has no name, number of keys and number of arguments')
  end
  a, k = a + 3 + na, k + nk
end
if a ~= #ARGV + 1 or k ~= #KEYS + 1 then
  return bad('the commands need ' .. (k - 2) .. ' keys after the fence and ' .. (a - 4) .. ' arguments after N; given ' .. (#KEYS - 1) .. ' and ' .. (#ARGV - 3))
end

local tok, holder = ARGV[1], ARGV[2]
local seen = redis.call('HMGET', KEYS[1], 'token', 'owner')
local high = seen[1] or '0'
local function stale()
  return redis.error_reply('STALE stale fencing token ' .. tok .. ' (highest accepted ' .. high .. ')')
end
if not string.match(tok, '^[1-9]%d*$') then
  return stale()
end
-- Decimal strings, never Lua numbers (exact only up to 2^53): the longer
-- is higher; of equal length, the bytewise higher.
local higher = #tok > #high or (#tok == #high and tok > high)
if not (higher or (tok == high and holder == seen[2])) then
  return stale()
end
redis.call('HSET', KEYS[1], 'token', tok, 'owner', holder)
local out = {1}
a, k = 4, 2
for i = 1, n do
  local name, nk, na = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  a = a + 3
  local argv = {}
  for _ = 1, nk do argv[#argv + 1] = KEYS[k]; k = k + 1 end
  for _ = 1, na do argv[#argv + 1] = ARGV[a]; a = a + 1 end
  local r = redis.pcall(name, unpack(argv))
  if type(r) == 'table' and r.err then
    return redis.error_reply('FENCECMD command ' .. (i - 1) .. ' failed after the fence was recorded (no rollback): ' .. r.err)
  end
  out[#out + 1] = r
end
return out

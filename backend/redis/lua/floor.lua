-- floor: raise a key's token counter to at least a floor; never lower it.
-- KEYS[1] token counter
-- ARGV[1] floor (decimal, no sign, no leading zeros)
-- Returns the counter after the call (as a decimal string). Compared as
-- decimal strings, length first, so values past 2^53 (where Lua numbers
-- lose precision) still compare exactly.
local cur = redis.call('GET', KEYS[1]) or '0'
local f = ARGV[1]
if #f > #cur or (#f == #cur and f > cur) then
  redis.call('SET', KEYS[1], f)
  return f
end
return cur

-- release: delete the lock if owner and token match, and wake waiters.
-- KEYS[1] lock record "<token>\n<owner>\n<meta>", KEYS[2] lock-delay
-- marker (see acquire.lua): a release ends no lock delay's gap, so it goes
-- ARGV[1] the grant's "<token>\n<owner>\n" (the record's head), ARGV[2]
-- release channel
-- Returns 1 if released, 0 if the grant is not current (nothing changed).
-- The counter is left alone, so the next grant's token is still higher.
local cur = redis.call('GET', KEYS[1])
if not cur or string.sub(cur, 1, #ARGV[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('PUBLISH', ARGV[2], 'released')
return 1

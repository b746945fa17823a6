-- settings: a chat's settings changed in one step (an admin's pause, resume
-- or limits), all of it or none.   KEYS: 1 settings
-- ARGV: 1 deadline: the server time (ms) after which the caller has given up
--         on this call ("" none). A call Redis reaches later (it was frozen,
--         or busy, while the call waited in its socket) is refused before it
--         writes anything, answered {'late'}: the admin was told it was
--         refused, and it must not take effect after that.
--       2 settings TTL (ms)
--       3 the fields to delete, separated by spaces ("" none)
--       4... field, value, field, value ... to set
if ARGV[1] ~= '' then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[1]) then
    return {'late'}
  end
end
for field in string.gmatch(ARGV[3], '%S+') do
  redis.call('HDEL', KEYS[1], field)
end
if #ARGV > 3 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 4))
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return {'ok'}

-- release: give back a rate-cap slot and the turn hold of an answer that sent
-- nothing, and log why.
-- KEYS: 1 rate(bot)  2 log  3 turn holds
-- ARGV: 1 message id  2 log entry ("" none)  3 log size  4 ttl_ms  5 the hold (hold_name)
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[5])
if ARGV[2] ~= '' then
  redis.call('LPUSH', KEYS[2], ARGV[2])
  -- numbers as strings: Lua would sprintf them with "%.14g" (see common.lua)
  redis.call('LTRIM', KEYS[2], '0', string.format('%d', tonumber(ARGV[3]) - 1))
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
return 1

-- sent: count a message this bot sent as a bot turn (prepended: common.lua).
-- ARGV (after the common 10, whose deadline is "": a sent message is a turn
-- whenever Redis hears of it): 11 decision log entry of the answered message
--   ("" none)  12 the hold this message fills (hold_name; "" none: a later
--   piece, a warning)  13 the author of the message it answers ("" none)
-- Returns {turn, soft, hard}
local answered = ARGV[12] ~= '' and ARGV[12] or nil
local kind, soft, hard = count(redis.call('HGET', K_IDS, MSG_ID), '', answered)
if ARGV[11] ~= '' then push_log(ARGV[11]) end
if answered and ARGV[13] ~= '' and L.pace > 0 then
  -- when this bot answered them: their answer back is timed from here
  redis.call('HSET', K_PACE, 's:' .. MARK .. ARGV[13], NOW)
  redis.call('PEXPIRE', K_PACE, int(L.pace + 1000))
end
return {turn_of(kind, soft, hard), soft, hard}

-- sent: count a message this bot sent as a bot turn (prepended: common.lua).
-- ARGV (after the common 9): 10 decision log entry of the answered message ("" none)
--   11 the hold this message fills (hold_name; "" none: a later piece, a warning)
-- Returns {turn, soft, hard}
local answered = ARGV[11] ~= '' and ARGV[11] or nil
local kind, soft, hard = count(redis.call('HGET', K_IDS, MSG_ID), '', answered)
if ARGV[10] ~= '' then push_log(ARGV[10]) end
return {turn_of(kind, soft, hard), soft, hard}

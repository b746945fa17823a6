-- sent: count a message this bot sent as a bot turn (prepended: common.lua).
-- ARGV (after the common 8): 9 decision log entry of the answered message ("" none)
-- Returns {turn, soft, hard}
local kind, soft, hard = count(redis.call('HGET', K_IDS, MSG_ID), '')
if ARGV[9] ~= '' then push_log(ARGV[9]) end
return {turn_of(kind, soft, hard), soft, hard}

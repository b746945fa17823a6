-- sent: count a message this bot sent as a bot turn (prepended: common.lua).
-- ARGV (after the common 20): 21 decision log entry of the answered message ("" none)
-- Returns {turn, soft, hard}
local kind, soft, hard = count()
if ARGV[21] ~= '' then push_log(ARGV[21]) end
return {turn_of(kind, soft, hard), soft, hard}

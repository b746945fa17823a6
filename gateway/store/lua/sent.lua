-- sent: count a message this bot sent as a bot turn (prepended: common.lua).
-- ARGV (after the common 10, whose deadline is "": a sent message is a turn
-- whenever Redis hears of it): 11 decision log entry of the answered message
--   ("" none)  12 the hold this message fills (hold_name; "" none: a later
--   piece, a warning)  13 the author of the message it answers ("" none)
-- Returns {turn, soft, hard}
local answered = ARGV[12] ~= '' and ARGV[12] or nil
local kind, soft, hard = count(redis.call('HGET', K_IDS, MSG_ID), '', answered)
if ARGV[11] ~= '' then push_log(ARGV[11]) end
-- The pace entries that still decide something: "s:" newer than the pace,
-- and the "f:" of the same person (an older "s:" times nothing, and the next
-- message of its person resets their "f:"). The rest go: in a chat busy
-- enough that K_PACE never lapses, it held one entry per person ever answered.
-- At most 512 fields a call to HDEL (unpack's stack).
local function sweep_pace()
  local flat = redis.call('HGETALL', K_PACE)
  local fresh, gone = {}, {}
  for i = 1, #flat, 2 do
    if string.sub(flat[i], 1, 2) == 's:' and now - tonumber(flat[i + 1]) < L.pace then
      fresh[string.sub(flat[i], 3)] = true
    end
  end
  for i = 1, #flat, 2 do
    if not fresh[string.sub(flat[i], 3)] then gone[#gone + 1] = flat[i] end
  end
  for i = 1, #gone, 512 do
    redis.call('HDEL', K_PACE, unpack(gone, i, math.min(i + 511, #gone)))
  end
end
if answered and ARGV[13] ~= '' and L.pace > 0 then
  -- when this bot answered them: their answer back is timed from here
  if redis.call('HSET', K_PACE, 's:' .. MARK .. ARGV[13], NOW) == 1
      and redis.call('HLEN', K_PACE) > 64 then  -- base.PACE_SWEEP_AT
    sweep_pace()
  end
  redis.call('PEXPIRE', K_PACE, TTL)  -- as admit.lua: the count outlives a slow answer
end
return {turn_of(kind, soft, hard), soft, hard}

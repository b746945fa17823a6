-- admit: one atomic decision for one inbound message (prepended: common.lua).
-- ARGV (after the common 10): 11 local reason ("" none)  12 author is a bot (1|0)
--   13 context messages to return when a reply is possible
--   14 this bot's hold on the message (hold_name)  15 how long it holds, ms (0: none)
-- Returns {turn, soft, hard, action, reason, warn, soft_limit, hard_limit,
--          max_replies, rate_window_ms, reserved, now, context json...}
local LOCAL, AUTHOR_IS_BOT, WANT_CTX = ARGV[11], ARGV[12] == '1', tonumber(ARGV[13])
local HOLD, HOLD_MS = ARGV[14], tonumber(ARGV[15])

local TURN_REASON = {soft_limit = 'turn_soft_limit', throttled = 'turn_throttled',
  hard_limit = 'turn_hard_limit', stopped = 'turn_stopped'}
-- a message counted earlier, decided on after the chat passed a limit
local LATE_REASON = {soft_limit = 'turn_throttled', throttled = 'turn_throttled',
  hard_limit = 'turn_stopped', stopped = 'turn_stopped'}

local function finish(action, reason, turn, soft, hard, warn, reserved, ctx)
  if action ~= '' then
    -- positional, as RedisStore packs and reads log entries (LOG_FIELDS); the
    -- numbers spliced in as int() makes them (cjson would sprintf "%.14g")
    local texts = cjson.encode({BOT, MSG_ID, AUTHOR, action,
      reason == '' and cjson.null or reason, turn})
    push_log('[' .. NOW .. ',' .. string.sub(texts, 2, -2) .. ',' .. int(soft) .. ','
      .. int(hard) .. ']')
  end
  local out = {turn, soft, hard, action, reason, warn, L.soft, L.hard, L.max_replies,
    L.rate_window, reserved, now}
  for _, c in ipairs(ctx or {}) do out[#out + 1] = c end
  return out
end

local seen = redis.call('HGET', K_IDS, MSG_ID)
if seen and handled_by(seen) then
  -- counted nothing now: the chat's counters as they are
  local c = redis.call('HMGET', K_STATE, 'soft', 'hard')
  return finish('drop', 'duplicate', 'none', tonumber(c[1] or '0'), tonumber(c[2] or '0'), '', 0)
end
if seen then redis.call('HSET', K_IDS, MSG_ID, seen .. MARK) end
local kind, soft, hard = count(seen, MARK, '')
local turn = turn_of(kind, soft, hard)

if LOCAL == 'own_message' or LOCAL == 'system_message' then
  return finish('drop', LOCAL, turn, soft, hard, '', 0)
end
if not PAUSED and (turn == 'soft_limit' or turn == 'hard_limit') then
  local threshold = turn == 'soft_limit' and 'soft' or 'hard'
  local claim = threshold .. ':' .. int(threshold == 'soft' and L.soft or L.hard)
  local st = redis.call('HMGET', K_STATE, 'epoch', 'sp:' .. BOT, claim)
  local epoch = st[1] or '0'
  if st[2] == epoch and st[3] ~= epoch then
    redis.call('HSET', K_STATE, claim, epoch)
    return finish('warn', TURN_REASON[turn], turn, soft, hard, threshold, 0)
  end
end
if LOCAL ~= '' then return finish('drop', LOCAL, turn, soft, hard, '', 0) end
if PAUSED then return finish('drop', 'paused', turn, soft, hard, '', 0) end
-- machine pace: a "person" answering this bot's reply to them faster than
-- L.pace, more than L.pace_max times in a row (an unflagged bot)
if not AUTHOR_IS_BOT and kind == 'r' and L.pace > 0 then
  local last = redis.call('HGET', K_PACE, 's:' .. MARK .. AUTHOR)
  if last and now - tonumber(last) < L.pace then
    local fast = redis.call('HINCRBY', K_PACE, 'f:' .. MARK .. AUTHOR, 1)
    -- the state's TTL, as the memory store keeps them: the count must outlive
    -- the bot's next answer however slow its backend (sent.lua sweeps)
    redis.call('PEXPIRE', K_PACE, TTL)
    if fast > L.pace_max then return finish('drop', 'machine_pace', turn, soft, hard, '', 0) end
  else
    redis.call('HDEL', K_PACE, 'f:' .. MARK .. AUTHOR)
  end
end
if kind == 'b' and turn ~= 'ok' then
  return finish('drop', TURN_REASON[turn], turn, soft, hard, '', 0)
end
if kind == 'b' and seen then
  local c = redis.call('HMGET', K_STATE, 'soft', 'hard')
  local now_turn = verdict(tonumber(c[1] or '0'), tonumber(c[2] or '0'))
  if now_turn ~= 'ok' then return finish('drop', LATE_REASON[now_turn], turn, soft, hard, '', 0) end
end
if AUTHOR_IS_BOT then
  local until_ms = redis.call('HGET', K_PAIRS, 'c:' .. pair_name(AUTHOR, BOT))
  if until_ms and tonumber(until_ms) > now then
    return finish('drop', 'pair_cooldown', turn, soft, hard, '', 0)
  end
end
if kind == 'b' then
  -- answers other bots are writing will be turns before this bot's answer
  local ahead = holds_ahead()
  if ahead > 0 then
    local c = redis.call('HMGET', K_STATE, 'soft', 'hard')
    local then_turn = verdict(tonumber(c[1] or '0') + ahead, tonumber(c[2] or '0') + ahead)
    if then_turn ~= 'ok' then
      return finish('drop', LATE_REASON[then_turn], turn, soft, hard, '', 0)
    end
  end
end
local reserved = 0
if L.rate_applies then
  redis.call('ZREMRANGEBYSCORE', K_RATE, '-inf', int(now - L.rate_window))
  if redis.call('ZCARD', K_RATE) >= L.max_replies then
    return finish('drop', 'rate_capped', turn, soft, hard, '', 0)
  end
  redis.call('ZADD', K_RATE, NOW, MSG_ID)
  redis.call('PEXPIRE', K_RATE, int(L.rate_window))
  reserved = 1
end
if HOLD_MS > 0 then
  redis.call('ZREMRANGEBYSCORE', K_HOLDS, '-inf', NOW)
  redis.call('ZADD', K_HOLDS, int(now + HOLD_MS), HOLD)
  if redis.call('PTTL', K_HOLDS) < HOLD_MS then redis.call('PEXPIRE', K_HOLDS, int(HOLD_MS)) end
end
local ctx = {}
if WANT_CTX > 0 then ctx = redis.call('LRANGE', K_CTX, '0', int(WANT_CTX)) end
return finish('', '', turn, soft, hard, '', reserved, ctx)

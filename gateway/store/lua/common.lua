-- Shared by admit.lua and sent.lua (the store prepends this file to each).
-- KEYS: 1 state  2 settings  3 ids  4 id order  5 pairs  6 context  7 log  8 rate(bot)
-- ARGV: 1 now_ms ("" = server TIME)  2 message id  3 author  4 author name
--       5 count kind (b|r|n)  6 text  7 this bot
--       8 soft_limit  9 hard_limit  10 max_replies  11 rate_window_ms  12 rate_applies (1|0)
--       13 pair_max_events  14 pair_window_ms  15 pair_cooldown_ms
--       16 state_ttl_ms  17 settings_ttl_ms  18 context_size  19 dedupe_entries  20 log_size
-- Times are integer milliseconds, as in the memory store.
local K_STATE, K_CFG, K_IDS, K_IDQ, K_PAIRS, K_CTX, K_LOG, K_RATE =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
local MSG_ID, AUTHOR, NAME, KIND, TEXT, BOT = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local STATE_TTL, SETTINGS_TTL = tonumber(ARGV[16]), tonumber(ARGV[17])
local CTX_SIZE, DEDUPE, LOG_SIZE = tonumber(ARGV[18]), tonumber(ARGV[19]), tonumber(ARGV[20])

-- Per-chat overrides set by an admin replace the bot's configured limits.
local cfg = redis.call('HMGET', K_CFG, 'paused', 'soft_limit', 'hard_limit', 'max_replies',
  'rate_window_ms')
local PAUSED = cfg[1] == '1'
local L = {
  soft = tonumber(cfg[2] or ARGV[8]),
  hard = tonumber(cfg[3] or ARGV[9]),
  max_replies = tonumber(cfg[4] or ARGV[10]),
  rate_window = tonumber(cfg[5] or ARGV[11]),
  rate_applies = ARGV[12] == '1',
  pair_max = tonumber(ARGV[13]),
  pair_window = tonumber(ARGV[14]),
  pair_cooldown = tonumber(ARGV[15]),
}
if cfg[1] or cfg[2] or cfg[3] or cfg[4] or cfg[5] then
  redis.call('PEXPIRE', K_CFG, SETTINGS_TTL)
end

local function pair_name(a, b)
  if a < b then return a .. '|' .. b end
  return b .. '|' .. a
end

local function verdict(soft, hard)
  if hard > L.hard then return 'stopped' end
  if hard == L.hard then return 'hard_limit' end
  if soft > L.soft then return 'throttled' end
  if soft == L.soft then return 'soft_limit' end
  return 'ok'
end

local function turn_of(kind, soft, hard)
  if kind == 'b' then return verdict(soft, hard) end
  if kind == 'r' then return 'reset' end
  return 'none'
end

-- Dedupe memory: a hash of seen ids plus a FIFO list that evicts the oldest.
local function remember(field, value)
  redis.call('HSET', K_IDS, field, value)
  if redis.call('RPUSH', K_IDQ, field) > DEDUPE then
    redis.call('HDEL', K_IDS, redis.call('LPOP', K_IDQ))
  end
  redis.call('PEXPIRE', K_IDS, STATE_TTL)
  redis.call('PEXPIRE', K_IDQ, STATE_TTL)
end

local function split_record(rec)
  local kind, soft, hard = string.match(rec, '^(%a) (%d+) (%d+)$')
  return kind, tonumber(soft), tonumber(hard)
end

-- One exchange of a bot pair: slide its window; past max_events, cool down.
local function exchange(pair)
  local field = 'w:' .. pair
  local kept = {}
  local raw = redis.call('HGET', K_PAIRS, field)
  if raw then
    for t in string.gmatch(raw, '%d+') do
      if tonumber(t) > now - L.pair_window then kept[#kept + 1] = t end
    end
  end
  kept[#kept + 1] = tostring(now)
  local first = math.max(1, #kept - L.pair_max)
  redis.call('HSET', K_PAIRS, field, table.concat(kept, ',', first, #kept))
  if #kept > L.pair_max then
    redis.call('HSET', K_PAIRS, 'c:' .. pair, now + L.pair_cooldown)
  end
  redis.call('PEXPIRE', K_PAIRS, math.max(L.pair_window, L.pair_cooldown) + 1000)
end

-- Count a message once per id: bot turn, reset, or nothing. Returns its record.
local function count()
  local seen = redis.call('HGET', K_IDS, MSG_ID)
  if seen then return split_record(seen) end
  local soft, hard = 0, 0
  if KIND == 'b' then
    soft = redis.call('HINCRBY', K_STATE, 'soft', 1)
    hard = redis.call('HINCRBY', K_STATE, 'hard', 1)
    local epoch = redis.call('HGET', K_STATE, 'epoch') or '0'
    local last = redis.call('HGET', K_STATE, 'last')
    redis.call('HSET', K_STATE, 'sp:' .. AUTHOR, epoch, 'last', AUTHOR)
    if last and last ~= AUTHOR then exchange(pair_name(AUTHOR, last)) end
    redis.call('PEXPIRE', K_STATE, STATE_TTL)
  elseif KIND == 'r' then
    if redis.call('EXISTS', K_STATE) == 1 then
      redis.call('HSET', K_STATE, 'soft', 0, 'hard', 0)
      redis.call('HINCRBY', K_STATE, 'epoch', 1)
      redis.call('PEXPIRE', K_STATE, STATE_TTL)
    end
  else
    local c = redis.call('HMGET', K_STATE, 'soft', 'hard')
    soft, hard = tonumber(c[1] or '0'), tonumber(c[2] or '0')
  end
  remember(MSG_ID, KIND .. ' ' .. soft .. ' ' .. hard)
  if KIND ~= 'n' and CTX_SIZE > 0 then
    redis.call('LPUSH', K_CTX, cjson.encode({id = MSG_ID, author = AUTHOR, name = NAME,
      bot = KIND == 'b', text = TEXT}))
    redis.call('LTRIM', K_CTX, 0, CTX_SIZE)
    redis.call('PEXPIRE', K_CTX, STATE_TTL)
  end
  return KIND, soft, hard
end

local function push_log(entry_json)
  redis.call('LPUSH', K_LOG, entry_json)
  redis.call('LTRIM', K_LOG, 0, LOG_SIZE - 1)
  redis.call('PEXPIRE', K_LOG, STATE_TTL)
end

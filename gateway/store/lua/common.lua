-- Shared by admit.lua and sent.lua (the store prepends this file to each).
-- KEYS: 1 state  2 settings  3 ids  4 id order  5 pairs  6 context  7 log  8 rate(bot)
--       9 turn holds  10 machine pace (per bot and person: "s:" last answer, "f:" fast answers back)
-- ARGV: 1 now_ms ("" = server TIME)  2 message id  3 author  4 author name
--       5 count kind (b|r|n)  6 text  7 this bot
--       8 the policy, 15 little-endian doubles (constant per bot and chat kind, so
--         the client sends one argument instead of fifteen, read in C): soft_limit
--         hard_limit max_replies rate_window_ms rate_applies(1|0) pair_max_events
--         pair_window_ms pair_cooldown_ms state_ttl_ms settings_ttl_ms context_size
--         dedupe_entries log_size pace_ms pace_max
--       9 the prefix of the author's turn holds (base.hold_name)
--      10 deadline: the server time (ms) after which the caller has given up on
--         this call ("" none). A call Redis reaches later - it was frozen, or
--         busy, while the call waited in its socket - is refused before it
--         writes anything (answered {'late'}): the caller has decided the
--         message without Redis, and a reservation or warning claim made now
--         would outlive that decision.
-- Times are integer milliseconds, as in the memory store.
local K_STATE, K_CFG, K_IDS, K_IDQ, K_PAIRS, K_CTX, K_LOG, K_RATE, K_HOLDS, K_PACE =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]

local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local now
if ARGV[1] == '' then
  now = server_ms()
else
  now = tonumber(ARGV[1])
end
if ARGV[10] ~= '' and (ARGV[1] == '' and now or server_ms()) > tonumber(ARGV[10]) then
  return {'late'}
end
-- Numbers reach redis.call as strings made by int(): Lua's own conversion is
-- sprintf("%.14g"), several times the cost of "%d" (bench/README.md).
local function int(n) return string.format('%d', n) end
local NOW = int(now)
local MSG_ID, AUTHOR, NAME, KIND, TEXT, BOT = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local AUTHOR_HOLDS = ARGV[9]
local P = {struct.unpack('<ddddddddddddddd', ARGV[8])}
local STATE_TTL, SETTINGS_TTL = P[9], P[10]
local CTX_SIZE, DEDUPE, LOG_SIZE = P[11], P[12], P[13]
local TTL = int(STATE_TTL)

-- Per-chat overrides set by an admin replace the bot's configured limits.
local cfg = redis.call('HMGET', K_CFG, 'paused', 'soft_limit', 'hard_limit', 'max_replies',
  'rate_window_ms')
local PAUSED = cfg[1] == '1'
local L = {
  soft = tonumber(cfg[2]) or P[1],
  hard = tonumber(cfg[3]) or P[2],
  max_replies = tonumber(cfg[4]) or P[3],
  rate_window = tonumber(cfg[5]) or P[4],
  rate_applies = P[5] == 1,
  pair_max = P[6],
  pair_window = P[7],
  pair_cooldown = P[8],
  pace = P[14],
  pace_max = P[15],
}
if cfg[1] or cfg[2] or cfg[3] or cfg[4] or cfg[5] then
  redis.call('PEXPIRE', K_CFG, int(SETTINGS_TTL))
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

-- Dedupe memory: a hash id -> record, plus a FIFO list of ids that evicts the
-- oldest. A record is "<kind> <soft> <hard>|" followed by "<bot>|" for every bot
-- that has handled the message, so one HGET answers "counted?" and "handled?".
local function new_record(record)
  redis.call('HSET', K_IDS, MSG_ID, record)
  if redis.call('RPUSH', K_IDQ, MSG_ID) > DEDUPE then
    redis.call('HDEL', K_IDS, redis.call('LPOP', K_IDQ))
  end
  redis.call('PEXPIRE', K_IDS, TTL)
  redis.call('PEXPIRE', K_IDQ, TTL)
end

local function split_record(rec)
  local kind, soft, hard = string.match(rec, '^(%a) (%d+) (%d+)|')
  return kind, tonumber(soft), tonumber(hard)
end

-- A bot's handled mark, with '|' and '%' escaped so no id can fake another's.
local MARK = string.gsub(BOT, '[|%%]', function(c) return string.format('%%%02X', c:byte()) end)
  .. '|'

local function handled_by(rec)
  return string.find(rec, '|' .. MARK, 1, true) ~= nil
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
  kept[#kept + 1] = NOW
  local first = math.max(1, #kept - L.pair_max)
  redis.call('HSET', K_PAIRS, field, table.concat(kept, ',', first, #kept))
  if #kept > L.pair_max then
    redis.call('HSET', K_PAIRS, 'c:' .. pair, int(now + L.pair_cooldown))
  end
  -- only ever longer: bots with a shorter `pairs:` policy share the key, and
  -- must not cut another pair's cooldown short
  local ttl = math.max(L.pair_window, L.pair_cooldown) + 1000
  if redis.call('PTTL', K_PAIRS) < ttl then redis.call('PEXPIRE', K_PAIRS, int(ttl)) end
end

-- Turn holds: a sorted set of "this bot will answer that message" (hold_name),
-- scored by when the hold lapses. A bot message sees the chat as it will be once
-- every held answer is sent.
local function holds_ahead()
  return redis.call('ZCOUNT', K_HOLDS, '(' .. NOW, '+inf')
end

-- A new bot turn fills one hold of its author: the hold for the message it
-- answers when that is known (`answered`, from sent), else the author's oldest
-- (its reply was observed by another bot before it was reported sent).
local function fill_hold(answered)
  if answered ~= '' and redis.call('ZREM', K_HOLDS, answered) == 1 then return end
  for _, h in ipairs(redis.call('ZRANGE', K_HOLDS, 0, -1)) do
    if string.sub(h, 1, #AUTHOR_HOLDS) == AUTHOR_HOLDS then
      redis.call('ZREM', K_HOLDS, h)
      return
    end
  end
end

-- Count a message once per id: bot turn, reset, or nothing. `seen` is its
-- dedupe record if it has one; `mark` is appended to a new record ("" or "bot|");
-- `answered` is the hold a new bot turn fills ("" none known, nil none at all).
-- Returns kind, soft, hard.
local function count(seen, mark, answered)
  if seen then return split_record(seen) end
  local soft, hard = 0, 0
  if KIND == 'b' then
    if answered then fill_hold(answered) end
    local st = redis.call('HMGET', K_STATE, 'soft', 'hard', 'epoch', 'last')
    soft, hard = (tonumber(st[1]) or 0) + 1, (tonumber(st[2]) or 0) + 1
    local last = st[4]
    redis.call('HSET', K_STATE, 'soft', int(soft), 'hard', int(hard), 'sp:' .. AUTHOR,
      st[3] or '0', 'last', AUTHOR)
    if last and last ~= AUTHOR then exchange(pair_name(AUTHOR, last)) end
    redis.call('PEXPIRE', K_STATE, TTL)
  elseif KIND == 'r' then
    if redis.call('EXISTS', K_STATE) == 1 then
      redis.call('HSET', K_STATE, 'soft', '0', 'hard', '0')
      redis.call('HINCRBY', K_STATE, 'epoch', '1')
      redis.call('PEXPIRE', K_STATE, TTL)
    end
  else
    local c = redis.call('HMGET', K_STATE, 'soft', 'hard')
    soft, hard = tonumber(c[1] or '0'), tonumber(c[2] or '0')
  end
  new_record(KIND .. ' ' .. int(soft) .. ' ' .. int(hard) .. '|' .. mark)
  if KIND ~= 'n' and CTX_SIZE > 0 then
    -- positional: id, author, name, bot, text (RedisStore reads it)
    redis.call('LPUSH', K_CTX, cjson.encode({MSG_ID, AUTHOR, NAME, KIND == 'b', TEXT}))
    redis.call('LTRIM', K_CTX, '0', int(CTX_SIZE))
    redis.call('PEXPIRE', K_CTX, TTL)
  end
  return KIND, soft, hard
end

local function push_log(entry_json)
  if redis.call('LPUSH', K_LOG, entry_json) > LOG_SIZE then redis.call('RPOP', K_LOG) end
  redis.call('PEXPIRE', K_LOG, TTL)
end

-- The guard's state on Redis: one JSON value per session under KEYS[1].
local function load()
  local raw = redis.call('GET', KEYS[1])
  if raw then return cjson.decode(raw) end
  return nil
end
local function save(state, ttl_ms) redis.call('SET', KEYS[1], cjson.encode(state), 'PX', ttl_ms) end
local function drop() redis.call('DEL', KEYS[1]) end
local payload = cjson.decode
local limits = cjson.decode
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

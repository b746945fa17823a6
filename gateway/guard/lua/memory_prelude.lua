-- The guard's state in this process (lupa's LuaJIT, a Lua 5.1): the memory store holds
-- each session's table; the host functions are passed in as HOST.
local function load() return HOST.load(KEYS[1]) end
local function save(state, ttl_ms) HOST.save(KEYS[1], state, ttl_ms) end
local function drop() HOST.drop(KEYS[1]) end
local function payload(p) return p end  -- a table already (MemoryEngine.run)
local function limits(text) return HOST.limits(text) end  -- cached: read-only
local function now() return HOST.now() end

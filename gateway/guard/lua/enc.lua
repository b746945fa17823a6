-- The guard's JSON out (docs/agent-guard.md), between the prelude and
-- guard.lua in both engines, and alone in the memory engine, which keeps an
-- idle session as the text it makes (gateway/guard/engine.py). Deterministic
-- (sorted keys), so both stores answer byte for byte alike. Pieces go to one
-- buffer and plain strings skip the escaping pass: half the time of
-- concatenating per value, which matters when a session is kept as text.
local function escape(c)
  if c == '"' then return '\\"' elseif c == '\\' then return '\\\\' end
  return string.format('\\u%04x', c:byte())
end

local function put(buf, v)
  local t = type(v)
  if t == 'string' then
    if v:find('[%c"\\]') then v = v:gsub('[%c"\\]', escape) end
    buf[#buf + 1] = '"' .. v .. '"'
  elseif t == 'number' then
    if v == math.floor(v) and math.abs(v) < 1e15 then
      buf[#buf + 1] = string.format('%d', v)
    else
      buf[#buf + 1] = string.format('%.14g', v)
    end
  elseif t == 'boolean' then
    buf[#buf + 1] = tostring(v)
  elseif t == 'table' then
    if next(v) == nil or #v > 0 then
      buf[#buf + 1] = '['
      for i = 1, #v do
        if i > 1 then buf[#buf + 1] = ',' end
        put(buf, v[i])
      end
      buf[#buf + 1] = ']'
      return
    end
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys)
    buf[#buf + 1] = '{'
    for i, k in ipairs(keys) do
      if i > 1 then buf[#buf + 1] = ',' end
      put(buf, k)
      buf[#buf + 1] = ':'
      put(buf, v[k])
    end
    buf[#buf + 1] = '}'
  else
    buf[#buf + 1] = 'null'
  end
end

local function enc(v)
  local buf = {}
  put(buf, v)
  return table.concat(buf)
end

-- ticket: spend a decide-mode ticket (gateway/store/tickets.py, next_state).
-- KEYS: 1 the ticket  ARGV: 1 how: 's' (sent) or 'r' (released)
-- The value is the state letter ('i' issued, 's' sent, 'r' released) then the
-- record. Returns the value before the call, or false for no such ticket.
local v = redis.call('GET', KEYS[1])
if not v then return false end
local state = string.sub(v, 1, 1)
if state == 'i' or (state == 's' and ARGV[1] == 's') then
  redis.call('SET', KEYS[1], ARGV[1] .. string.sub(v, 2), 'KEEPTTL')
end
return v

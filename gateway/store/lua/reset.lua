-- reset: zero a chat's counters (voiding warn claims and spoke marks) and its
-- pair windows and cooldowns, and its machine-pace timings.   KEYS: 1 state  2 pairs  3 pace
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'soft', 0, 'hard', 0)
  redis.call('HINCRBY', KEYS[1], 'epoch', 1)
end
redis.call('DEL', KEYS[2], KEYS[3])
return 1

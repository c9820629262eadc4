-- sent.lua: a message of a (rule, channel) with a minPeriod went out: the
-- period runs from the end of its send, not from its gate, so that at the
-- provider the next message comes minPeriod after this one at the least.
-- KEYS[1] hash {last = ms the period started, ...}
-- Reply   0
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local last = tonumber(redis.call('HGET', KEYS[1], 'last'))
-- No state: it expired or was never made; nothing to move.
if last and now > last then redis.call('HSET', KEYS[1], 'last', now) end
return 0

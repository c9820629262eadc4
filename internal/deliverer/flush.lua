-- flush.lua: take the notifications gathered during a minPeriod as one digest.
-- KEYS[1] hash {last, sched}; KEYS[2] pending id -> job; KEYS[3] in flight
-- ARGV    minPeriod(ms)
-- Reply   {0, id, job, id, job, ...}  send this digest, just taken; the
--                                     pair '#', generation marks which
--                                     digest it is, for drop.lua
--         {3, id, job, id, job, ...}  send the digest already in flight
--                                     (again, if a send of it failed or
--                                     crashed: same content)
--         {1, delay}                  too early: come back in delay ms
--         {2}                         nothing to send
local inflight = redis.call('HGETALL', KEYS[3])
if #inflight > 0 then
  table.insert(inflight, 1, 3)
  return inflight
end
-- Nothing pending needs no flush, now or later.
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('HDEL', KEYS[1], 'sched')
  return {2}
end
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local period = tonumber(ARGV[1])
local last = tonumber(redis.call('HGET', KEYS[1], 'last'))
if last and now < last + period then return {1, last + period - now} end
redis.call('RENAME', KEYS[2], KEYS[3])
-- A count kept with the state tells this digest from the next ones.
redis.call('HSET', KEYS[3], '#', redis.call('HINCRBY', KEYS[1], 'gen', 1))
redis.call('PEXPIRE', KEYS[3], period + 86400000)
redis.call('HSET', KEYS[1], 'last', now)
redis.call('HDEL', KEYS[1], 'sched')
redis.call('PEXPIRE', KEYS[1], period + 86400000)
inflight = redis.call('HGETALL', KEYS[3])
table.insert(inflight, 1, 0)
return inflight

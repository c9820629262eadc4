-- gate.lua: the minPeriod gate. May a notification for a (rule, channel) go
-- now, or must it wait for the digest at the end of the channel's minPeriod?
-- KEYS[1] hash {last = ms of the last send, sched = ms a flush is due}
-- KEYS[2] hash of pending notifications: id -> job, and '#n' (how many),
--         '#bytes' (their size) and '#omitted' (how many were left out)
-- KEYS[3] sorted set of the ids gathered, by ms
-- ARGV    minPeriod(ms) id job maxItems maxBytes
-- Reply   {0}                  send now (the minPeriod starts now, and
--                              again when the send ends: sent.lua)
--         {1, 0, omitted}      gathered (now or before); no flush to schedule
--         {2, delay, omitted}  gathered; schedule a flush in delay ms
-- omitted is 1 when the digest was full (maxItems jobs, or maxBytes of
-- them): the job is then only counted, so that the digest stays one bounded
-- message and its flush one short script, and says how many it left out.
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local period = tonumber(ARGV[1])
local keep = period + 86400000
-- A job gathered before comes back when its worker died before recording
-- it: once flushed, its notification is in a digest already.
if redis.call('ZSCORE', KEYS[3], ARGV[2]) and redis.call('HEXISTS', KEYS[2], ARGV[2]) == 0 then
  return {1, 0, 0}
end
local last = tonumber(redis.call('HGET', KEYS[1], 'last'))
if (not last or now >= last + period) and redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('HSET', KEYS[1], 'last', now)
  redis.call('PEXPIRE', KEYS[1], keep)
  return {0}
end
local added, omitted = 0, 0
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 0 then
  added = 1
  local n = tonumber(redis.call('HGET', KEYS[2], '#n') or '0')
  local bytes = tonumber(redis.call('HGET', KEYS[2], '#bytes') or '0')
  -- The first job is always kept: a digest carries at least one firing.
  if n > 0 and (n >= tonumber(ARGV[4]) or bytes + #ARGV[3] > tonumber(ARGV[5])) then
    omitted = 1
    redis.call('HINCRBY', KEYS[2], '#omitted', 1)
  else
    redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
    redis.call('HINCRBY', KEYS[2], '#n', 1)
    redis.call('HINCRBY', KEYS[2], '#bytes', #ARGV[3])
  end
end
redis.call('PEXPIRE', KEYS[2], keep)
redis.call('ZADD', KEYS[3], now, ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - keep)
redis.call('PEXPIRE', KEYS[3], keep)
local sched = tonumber(redis.call('HGET', KEYS[1], 'sched'))
-- A redelivered job schedules again: its first schedule may never have
-- reached the broker. Extra flushes find nothing and do nothing.
if added == 1 and sched then return {1, 0, omitted} end
local at = (last or now) + period
redis.call('HSET', KEYS[1], 'sched', at)
redis.call('PEXPIRE', KEYS[1], keep)
return {2, math.max(at - now, 0), omitted}

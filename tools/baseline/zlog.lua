-- The sorted-set log, for comparison only: exact, one member per event.
-- KEYS[1] sorted set; ARGV: now(ms) period(ms) threshold member
-- Returns 1 when this event makes the count reach the threshold.
local now, period, threshold = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - period)
local count = redis.call('ZCARD', KEYS[1])
local fired = 0
if count < threshold then
  redis.call('ZADD', KEYS[1], now, ARGV[4])
  if count + 1 == threshold then fired = 1 end
end
redis.call('PEXPIRE', KEYS[1], period)
return fired

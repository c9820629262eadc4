-- Hawk's fixed-window counter, for comparison only.
-- KEYS[1] hash of (project, rule, group, period); ARGV: now(ms) period(ms) threshold
-- Returns 1 when this event makes the count equal the threshold.
local now, period, threshold = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local start = tonumber(redis.call('HGET', KEYS[1], 'timestamp'))
if not start or start + period < now then
  redis.call('HSET', KEYS[1], 'timestamp', now, 'counter', 0)
  redis.call('PEXPIRE', KEYS[1], period)
end
local count = redis.call('HINCRBY', KEYS[1], 'counter', 1)
if count == threshold then return 1 end
return 0

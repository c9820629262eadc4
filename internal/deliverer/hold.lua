-- hold.lua: keep a firing that a snooze held back, for the snooze's summary.
-- KEYS[1] hash: id -> notification, '#n' (how many), '#omitted' (how many
--         were left out, the summary being full), '#scheduled'
-- ARGV    id notification maxItems ttl(ms)
-- Reply   1 when the caller must schedule the check that sends the summary
--         once the snooze ends: for the first firing held, and again for a
--         firing held before (its worker may have died before scheduling;
--         extra checks find the summary settled and do nothing); else 0.
local again = redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1
if not again then
  local n = tonumber(redis.call('HGET', KEYS[1], '#n') or '0')
  if n >= tonumber(ARGV[3]) then
    redis.call('HINCRBY', KEYS[1], '#omitted', 1)
  else
    redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
    redis.call('HINCRBY', KEYS[1], '#n', 1)
  end
end
local first = redis.call('HSETNX', KEYS[1], '#scheduled', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
if again or first == 1 then return 1 end
return 0

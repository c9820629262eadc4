-- quiet_done.lua: a quiet period's recap to a destination is recorded (sent,
-- or failed for good): drop the firings it carried, but keep their ids and
-- the marks, so that a try of a firing's job that comes again still finds
-- it held, and later recap jobs find the recap sent.
-- KEYS[1] the hash of quiet_hold.lua
-- ARGV    ttl(ms)
-- Reply   0
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local f = all[i]
  if string.sub(f, 1, 1) ~= '#' and string.sub(f, 1, 2) ~= 'r:' and all[i + 1] ~= '' then
    redis.call('HSET', KEYS[1], f, '')
  end
end
redis.call('HSET', KEYS[1], '#sent', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 0

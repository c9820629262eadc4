-- quiet_take.lua: take what a quiet period held for a destination, as its
-- recap, once the period is over.
-- KEYS[1] the hash of quiet_hold.lua
-- ARGV    ttl(ms): how long to keep it now
-- Reply   the hash, field and value in turn, with '#taken' set: from then
--         on nothing is added (a firing that comes later is sent on its
--         own), so every try of the recap sends the same. Empty when
--         nothing was held (or it expired).
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
redis.call('HSETNX', KEYS[1], '#taken', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return redis.call('HGETALL', KEYS[1])

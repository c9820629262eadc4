-- Claims the storms due by Redis' clock: each one's score moves a lease
-- ahead, so no other worker claims it until then. Replies the lease (the
-- new score, the claim's token) followed by the claimed ids.
-- KEYS: due set. ARGV: lease (ms), most to claim.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tostring(now + tonumber(ARGV[1]))
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  redis.call('ZADD', KEYS[1], lease, id)
end
table.insert(ids, 1, lease)
return ids

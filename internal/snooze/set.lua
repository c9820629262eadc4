-- set.lua: snooze a rule, or one group of it, until a time.
-- KEYS[1] hash of a project's snoozes: field (rule or rule/group) -> JSON
--         {"projectId","ruleId","groupHash","since","until","summary"}
--         with since and until in ms
-- ARGV    field json(with since = now) until now
-- Reply   the JSON stored
-- A snooze still running is extended (or shortened), keeping its since:
-- it is the same snooze, and what it held back gets one summary. Ended
-- entries are pruned, and the hash expires with its last snooze.
local now = tonumber(ARGV[4])
local entry = cjson.decode(ARGV[2])
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then
  local o = cjson.decode(old)
  if tonumber(o['until']) > now then entry.since = o.since end
end
local stored = cjson.encode(entry)
redis.call('HSET', KEYS[1], ARGV[1], stored)
local last = 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local u = tonumber(cjson.decode(all[i + 1])['until'])
  if u <= now then
    redis.call('HDEL', KEYS[1], all[i])
  elseif u > last then
    last = u
  end
end
if last > 0 then redis.call('PEXPIREAT', KEYS[1], last) end
return stored

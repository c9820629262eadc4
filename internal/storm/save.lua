-- Writes a claimed storm back, if its claim still holds (its score is the
-- lease it was claimed with; else 0 and nothing changes). With ARGV[4]
-- empty the storm is deleted, else its record is replaced and its next
-- look scheduled; ARGV[5] '1' frees its rule, group and window for a new
-- storm.
-- KEYS: due set, record, active storm of (project, rule, group, window).
-- ARGV: storm id, lease, record, next look (Unix ms) or '', end.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then
  return 0
end
if ARGV[5] == '1' and redis.call('GET', KEYS[3]) == ARGV[1] then
  redis.call('DEL', KEYS[3])
end
if ARGV[4] == '' then
  redis.call('DEL', KEYS[2])
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('SET', KEYS[2], ARGV[3])
  redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
end
return 1

-- Writes a claimed storm back, if its claim still holds (its score is the
-- lease it was claimed with; else 0 and nothing changes). With ARGV[4]
-- empty the storm is deleted, else its record is replaced and its next
-- look scheduled; ARGV[5] '1' frees its rule, group and window for a new
-- storm. Ending it over (ARGV[6], when it fell quiet) is refused, and the
-- storm looked at again at ARGV[7], if a firing joined it after that (a
-- firing counted after the look that decided): 2.
-- KEYS: due set, record, active storm of (project, rule, group, window),
-- latest firing that joined it.
-- ARGV: storm id, lease, record, next look (Unix ms) or '', end, quiet
-- since (Unix ms) or '', look again at (Unix ms).
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then
  return 0
end
if ARGV[5] == '1' and redis.call('GET', KEYS[3]) == ARGV[1] then
  if ARGV[6] ~= '' and tonumber(redis.call('GET', KEYS[4]) or '0') > tonumber(ARGV[6]) then
    redis.call('ZADD', KEYS[1], ARGV[7], ARGV[1])
    return 2
  end
  redis.call('DEL', KEYS[3], KEYS[4])
end
if ARGV[4] == '' then
  redis.call('DEL', KEYS[2])
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('SET', KEYS[2], ARGV[3])
  redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
end
return 1

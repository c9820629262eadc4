-- Starts a storm at a firing, unless the firing was recorded before (a
-- replay: 0) or a storm is active for its rule, group and window (the
-- firing belongs to it: 1). Started: 2.
-- KEYS: due set, active storm of (project, rule, group, window), firing
-- seen, storm record. ARGV: storm id, record, first look (Unix ms), how
-- long a firing is remembered (ms).
if not redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[4]) then
  return 0
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 1
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[4], ARGV[2])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return 2

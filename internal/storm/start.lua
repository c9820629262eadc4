-- Starts a storm at a firing, unless the firing was recorded before (a
-- replay: 0) or a storm is active for its rule, group and window (the
-- firing joins it, and its time is kept for the end's check: 1). Started: 2.
-- KEYS: due set, active storm of (project, rule, group, window), firing
-- seen, storm record, latest firing that joined the active storm.
-- ARGV: storm id, record, first look (Unix ms), how long a firing is
-- remembered (ms), the firing's time (Unix ms).
if not redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[4]) then
  return 0
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  local last = tonumber(redis.call('GET', KEYS[5]) or '0')
  if tonumber(ARGV[5]) > last then
    redis.call('SET', KEYS[5], ARGV[5])
  end
  return 1
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[5])
redis.call('SET', KEYS[4], ARGV[2])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return 2

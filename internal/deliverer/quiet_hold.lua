-- quiet_hold.lua: hold a firing made in quiet hours for the recap that its
-- destination gets when the quiet period ends.
-- KEYS[1] hash of one (destination, end of a quiet period): id ->
--         notification ('' when the recap was full and only counts it),
--         'r:<rule>' (firings of the rule), '#total', '#n' and '#bytes'
--         (those listed, their size), '#omitted', '#since' (ms the
--         earliest period began), '#scheduled', '#taken' (quiet_take.lua),
--         '#sent' (quiet_done.lua)
-- ARGV    id notification maxItems maxBytes ttl(ms) rule since(ms)
-- Reply   0  held (now, or by an earlier try of its job)
--         1  held; the caller must schedule the recap: for the first
--            firing, and again for one held before (its worker may have
--            died before scheduling; an extra recap job finds it sent)
--         2  late: the recap was taken without it; send it on its own
-- A firing is held once: a try of its job that comes again (its worker
-- killed before it recorded the firing) finds it, in the recap or not,
-- and the recap lists what it took once it is taken.
local id = ARGV[1]
local known = redis.call('HEXISTS', KEYS[1], id) == 1
if not known and redis.call('HEXISTS', KEYS[1], '#taken') == 1 then
  return 2
end
if not known then
  local n = tonumber(redis.call('HGET', KEYS[1], '#n') or '0')
  local bytes = tonumber(redis.call('HGET', KEYS[1], '#bytes') or '0')
  if n >= tonumber(ARGV[3]) or bytes + #ARGV[2] > tonumber(ARGV[4]) then
    redis.call('HSET', KEYS[1], id, '')
    redis.call('HINCRBY', KEYS[1], '#omitted', 1)
  else
    redis.call('HSET', KEYS[1], id, ARGV[2])
    redis.call('HINCRBY', KEYS[1], '#n', 1)
    redis.call('HINCRBY', KEYS[1], '#bytes', #ARGV[2])
  end
  redis.call('HINCRBY', KEYS[1], '#total', 1)
  redis.call('HINCRBY', KEYS[1], 'r:' .. ARGV[6], 1)
  local since = tonumber(redis.call('HGET', KEYS[1], '#since') or '0')
  if since == 0 or tonumber(ARGV[7]) < since then
    redis.call('HSET', KEYS[1], '#since', ARGV[7])
  end
end
local first = redis.call('HSETNX', KEYS[1], '#scheduled', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[5])
if redis.call('HEXISTS', KEYS[1], '#taken') == 0 and (known or first == 1) then return 1 end
return 0

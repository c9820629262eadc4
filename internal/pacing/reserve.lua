-- reserve.lua: when is the next message to a destination's turn, under
-- several sliding-window limits ("1 per second and 20 per minute")? The
-- turn is reserved at once, so that a message told to wait comes back once,
-- at its turn, instead of asking again and again.
--
-- KEYS[1] the destination's reserved turns, newest last: up to the largest
--         max of the limits, each an i8 of ms (Redis time)
-- ARGV    nlimits, then per limit: max period(ms)
-- Reply   wait ms until the reserved turn (0: go now)
--
-- A turn comes no sooner than period after the max-th turn before it, for
-- every limit, so no window of any period ever holds more than its max.
-- Turns only grow: each is at least the one before it.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local keep, longest = 0, 0
local limits = {}
for i = 1, tonumber(ARGV[1]) do
  local max, period = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  limits[i] = {max = max, p = period}
  if max > keep then keep = max end
  if period > longest then longest = period end
end
local raw = redis.call('GET', KEYS[1])
local turns = {}
if raw and #raw % 8 == 0 then
  for i = 1, #raw / 8 do turns[i] = struct.unpack('<i8', raw, (i - 1) * 8 + 1) end
end
local turn = now
for _, l in ipairs(limits) do
  local before = turns[#turns - l.max + 1]
  if before and before + l.p > turn then turn = before + l.p end
end
turns[#turns + 1] = turn
local first = math.max(1, #turns - keep + 1)
local out = {}
for i = first, #turns do out[#out + 1] = struct.pack('<i8', turns[i]) end
redis.call('SET', KEYS[1], table.concat(out), 'PX', turn - now + longest + 1000)
return turn - now

-- limit.lua: may one more message go to a destination now, under several
-- sliding-window limits ("1 per second and 20 per minute")?
--
-- KEYS[1] the destination's state, one key per list of periods (its layout
--         follows them): L (i8, newest time seen, ms), then per
--         limit a sum (u4) and a ring of bucket counts (u4), exactly as
--         observe.lua keeps a rule's windows.
-- ARGV    nlimits, then per limit: max period(ms) bucket(ms) nbuckets
-- Reply   {1, 0}      allowed, and counted
--         {0, wait}   denied, nothing counted: wait ms until it would be allowed
--
-- Buckets count up to one bucket more than the window holds, so the limiter
-- errs on the safe side: no true sliding window ever holds more than max.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local floor = math.floor
local a = ARGV
local limits, fmt, at, longest = {}, {'<i8'}, 2, 0
for i = 1, tonumber(a[1]) do
  local k = 2 + (i - 1) * 4
  local w = {max = tonumber(a[k]), p = tonumber(a[k + 1]), b = tonumber(a[k + 2]),
             n = tonumber(a[k + 3]), at = at}
  fmt[#fmt + 1] = string.rep('I4', 1 + w.n)
  at = at + 1 + w.n
  if w.p > longest then longest = w.p end
  limits[i] = w
end
fmt = table.concat(fmt)

local raw = redis.call('GET', KEYS[1])
local v
if raw then
  v = {struct.unpack(fmt, raw)}
else
  v = {}
  for i = 1, at - 1 do v[i] = 0 end
end
local L = v[1]
local newL = now
if L > now then newL = L end

local allowed, wait = true, 0
for _, w in ipairs(limits) do
  if L > 0 then
    local lo_old, lo_new = floor((L - w.p) / w.b), floor((newL - w.p) / w.b)
    if lo_new - lo_old >= w.n then
      for i = w.at, w.at + w.n do v[i] = 0 end
    else
      for idx = lo_old, lo_new - 1 do
        local i = w.at + 1 + idx % w.n
        v[w.at] = v[w.at] - v[i]
        v[i] = 0
      end
    end
  end
  if v[w.at] >= w.max then
    -- Denied until enough of the oldest buckets have left the window.
    allowed = false
    local lo, left = floor((newL - w.p) / w.b), v[w.at]
    for idx = lo, floor(newL / w.b) do
      left = left - v[w.at + 1 + idx % w.n]
      if left < w.max then
        local t = (idx + 1) * w.b + w.p - newL
        if t > wait then wait = t end
        break
      end
    end
  end
end
v[1] = newL
if allowed then
  for _, w in ipairs(limits) do
    local i = w.at + 1 + floor(newL / w.b) % w.n
    v[i] = v[i] + 1
    v[w.at] = v[w.at] + 1
  end
end
redis.call('SET', KEYS[1], struct.pack(fmt, unpack(v)), 'PX', longest + 1000)
if allowed then return {1, 0} end
return {0, wait}

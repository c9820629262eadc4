-- observe.lua: count a batch of events of ONE (project, group) against the
-- rules they matched, atomically, and say which rules fire.
--
-- KEYS[1]  the group's key base "<prefix>:{<project>:<group>}". Every key the
--          script touches starts with it, so all share one Cluster slot.
-- ARGV     dedupTTL(ms) nrules
--          per rule:  key cooldown(ms) users(0|1) nwindows
--                     per window: threshold period(ms) bucket(ms) nbuckets
--          nevents
--          per event: id ts(ms, -1 = now) user nmatched rule-index...
--
-- Per rule the state is one string of little-endian integers, read with one
-- GET and written with one SET:
--   L (i8), the rule's clock: newest event time seen (ms)
--   U (i8), quiet until (ms)
--   per window: sum (u4), then a ring of nbuckets counts (u4); bucket idx
--   (= floor(t / bucket)) lives at position idx % nbuckets. The ring holds
--   exactly the buckets from floor((L - period) / bucket) to floor(L / bucket);
--   sum is their total, i.e. the window's count.
-- countBy users keeps a sorted set user -> newest time seen, trimmed to the
-- longest window and capped at the largest threshold (exact up to it).
--
-- Reply, flat integers, per event:
--   te dup nmatched, then per matched rule: fired L U window nwindows count...
-- An event whose id was seen within dedupTTL counts nothing and replays its
-- first reply (dup=1) if something fired then, else its time and empty
-- outcomes (fired=0 L=0 U=0 window=-1 nwindows=0).

local base = KEYS[1]
local a = ARGV
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local floor = math.floor

local dedup_ttl = tonumber(a[1])
local slot = floor(now / dedup_ttl)
local dedup_cur = base .. ':m:' .. slot
local dedup_prev = base .. ':m:' .. (slot - 1)

local rules = {}
local p = 3
for r = 1, tonumber(a[2]) do
  local rule = {key = base .. ':r:' .. a[p], cooldown = tonumber(a[p + 1]),
                users = a[p + 2] == '1', windows = {}, maxp = 0, cap = 0}
  local nw = tonumber(a[p + 3])
  p = p + 4
  local fmt, at = {'<i8i8'}, 3 -- at: index of the next value in the state
  for i = 1, nw do
    local w = {t = tonumber(a[p]), p = tonumber(a[p + 1]), b = tonumber(a[p + 2]),
               n = tonumber(a[p + 3]), at = at}
    p = p + 4
    if not rule.users then
      fmt[#fmt + 1] = string.rep('I4', 1 + w.n)
      at = at + 1 + w.n
    end
    if w.p > rule.maxp then rule.maxp = w.p end
    if w.t > rule.cap then rule.cap = w.t end
    rule.windows[i] = w
  end
  rule.fmt, rule.size, rule.counts = table.concat(fmt), at - 1, {}
  rules[r] = rule
end

-- load reads a rule's state on first use: v[1] = L, v[2] = U, and per
-- window v[w.at] = sum, v[w.at + 1 + pos] = the ring's count at pos.
local function load(rule)
  if rule.v then return end
  local raw = redis.call('GET', rule.key)
  local v
  if raw then
    v = {struct.unpack(rule.fmt, raw)}
  else
    v = {}
    for i = 1, rule.size do v[i] = 0 end
  end
  rule.v = v
end

-- slide moves window w from clock L to newL, dropping the buckets that fell out.
local function slide(v, w, L, newL)
  local lo_old, lo_new = floor((L - w.p) / w.b), floor((newL - w.p) / w.b)
  if lo_new <= lo_old then return end
  if lo_new - lo_old >= w.n then
    for i = w.at, w.at + w.n do v[i] = 0 end
    return
  end
  local ring = w.at + 1
  for idx = lo_old, lo_new - 1 do
    local i = ring + idx % w.n
    v[w.at] = v[w.at] - v[i]
    v[i] = 0
  end
end

-- observe counts one event at time te for rule and appends its reply to
-- out after index n; it returns the new last index.
local function observe(rule, te, user, out, n)
  load(rule)
  local v = rule.v
  local L = v[1]
  if rule.users and user == '' then
    -- Nothing to count: report the state as it is.
    n = n + 1; out[n] = 0; n = n + 1; out[n] = L; n = n + 1; out[n] = v[2]
    n = n + 1; out[n] = -1; n = n + 1; out[n] = #rule.windows
    for _, w in ipairs(rule.windows) do
      n = n + 1; out[n] = L > 0 and redis.call('ZCOUNT', rule.key .. ':u', '(' .. (L - w.p), '+inf') or 0
    end
    return n, 0
  end
  local newL = te
  if L > te then newL = L end
  local counts = rule.counts -- reused: no table per event
  if rule.users then
    local zkey = rule.key .. ':u'
    if te > newL - rule.maxp then
      redis.call('ZADD', zkey, 'GT', te, user)
      redis.call('ZREMRANGEBYSCORE', zkey, '-inf', newL - rule.maxp)
      local extra = redis.call('ZCARD', zkey) - rule.cap
      if extra > 0 then redis.call('ZPOPMIN', zkey, extra) end
    end
    for i, w in ipairs(rule.windows) do
      counts[i] = redis.call('ZCOUNT', zkey, '(' .. (newL - w.p), '+inf')
    end
    rule.touched_users = true
  else
    local windows = rule.windows
    for i = 1, #windows do
      local w = windows[i]
      if L > 0 then slide(v, w, L, newL) end
      local idx = floor(te / w.b)
      if idx >= floor((newL - w.p) / w.b) then
        local k = w.at + 1 + idx % w.n
        v[k] = v[k] + 1
        v[w.at] = v[w.at] + 1
      end
      counts[i] = v[w.at]
    end
  end
  v[1] = newL
  rule.dirty = true

  local fired, which = 0, -1
  if newL >= v[2] then
    if #rule.windows == 0 then
      fired = 1
    else
      for i, w in ipairs(rule.windows) do
        if counts[i] >= w.t then fired, which = 1, i - 1; break end
      end
    end
    if fired == 1 then
      local cd = rule.cooldown
      if cd < 1 then cd = 1 end
      v[2] = newL + cd
    end
  end
  n = n + 1; out[n] = fired; n = n + 1; out[n] = newL; n = n + 1; out[n] = v[2]
  n = n + 1; out[n] = which; n = n + 1; out[n] = #rule.windows
  for i = 1, #rule.windows do n = n + 1; out[n] = counts[i] end
  return n, fired
end

-- save writes a rule's state back and renews its TTL.
local function save(rule)
  local ttl = rule.maxp
  if rule.cooldown > ttl then ttl = rule.cooldown end
  ttl = ttl + 1000
  redis.call('SET', rule.key, struct.pack(rule.fmt, unpack(rule.v)), 'PX', ttl)
  if rule.touched_users then redis.call('PEXPIRE', rule.key .. ':u', ttl) end
end

-- First results of the event ids of this call seen within dedupTTL: two
-- HMGETs for the whole call rather than two lookups per event.
local nevents = tonumber(a[p])
p = p + 1
local seen, ids = {}, {}
do
  local q = p
  for _ = 1, nevents do
    if a[q] ~= '' then ids[#ids + 1] = a[q] end
    q = q + 4 + tonumber(a[q + 3])
  end
end
for _, key in ipairs({dedup_prev, dedup_cur}) do
  for lo = 1, #ids, 1000 do
    local chunk = {unpack(ids, lo, math.min(lo + 999, #ids))}
    local got = redis.call('HMGET', key, unpack(chunk))
    for i, v in ipairs(chunk) do
      if got[i] then seen[v] = got[i] end
    end
  end
end

local out, n = {}, 0
local remember = {}
for _ = 1, nevents do
  local id, ts, user, nm = a[p], tonumber(a[p + 1]), a[p + 2], tonumber(a[p + 3])
  local first = p + 4
  p = first + nm
  local record = id ~= '' and seen[id]
  if record and not string.find(record, ',', 1, true) then
    -- Nothing fired the first time: the time, and empty outcomes.
    out[n + 1] = tonumber(record); out[n + 2] = 1; out[n + 3] = nm
    n = n + 3
    for _ = 1, nm do
      out[n + 1] = 0; out[n + 2] = 0; out[n + 3] = 0; out[n + 4] = -1; out[n + 5] = 0
      n = n + 5
    end
  elseif record then
    local start = n
    for v in string.gmatch(record, '[^,]+') do n = n + 1; out[n] = tonumber(v) end
    out[start + 2] = 1
  else
    local te = ts
    if te < 0 or te > now then te = now end
    local start = n
    out[n + 1] = te; out[n + 2] = 0; out[n + 3] = nm
    n = n + 3
    local any = 0
    for k = first, first + nm - 1 do
      local fired
      n, fired = observe(rules[tonumber(a[k])], te, user, out, n)
      any = any + fired
    end
    if id ~= '' then
      -- A repeat needs its firings back, not the counts of the rest.
      if any > 0 then
        record = table.concat(out, ',', start + 1, n)
      else
        record = tostring(te)
      end
      seen[id] = record -- the same id later in this call is a repeat too
      remember[#remember + 1] = id
      remember[#remember + 1] = record
    end
  end
end
for lo = 1, #remember, 1000 do
  redis.call('HSET', dedup_cur, unpack(remember, lo, math.min(lo + 999, #remember)))
end

for _, rule in ipairs(rules) do
  if rule.dirty then save(rule) end
end
if #remember > 0 then redis.call('PEXPIRE', dedup_cur, 2 * dedup_ttl) end
return out

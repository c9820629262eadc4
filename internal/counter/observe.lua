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
-- Per rule the state is one string, read and written with BITFIELD:
--   bits 0..63 L, the rule's clock: newest event time seen (ms)
--   bits 64..127 U, disarmed until (ms)
--   per window: sum (u32), then a ring of nbuckets u32 counts; bucket idx
--   (= floor(t / bucket)) lives at position idx % nbuckets. The ring holds
--   exactly the buckets from floor((L - period) / bucket) to floor(L / bucket);
--   sum is their total, i.e. the window's count.
-- countBy users keeps a sorted set user -> newest time seen, trimmed to the
-- longest window and capped at the largest threshold (exact up to it).
--
-- Reply, flat integers, per event:
--   te dup nmatched, then per matched rule: fired L U window nwindows count...
-- An event whose id was seen within dedupTTL replays its first reply (dup=1)
-- and counts nothing.

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
  local off = 128
  for i = 1, nw do
    local w = {t = tonumber(a[p]), p = tonumber(a[p + 1]), b = tonumber(a[p + 2]),
               n = tonumber(a[p + 3]), off = off}
    p = p + 4
    if not rule.users then off = off + 32 * (1 + w.n) end
    if w.p > rule.maxp then rule.maxp = w.p end
    if w.t > rule.cap then rule.cap = w.t end
    rule.windows[i] = w
  end
  rules[r] = rule
end

-- load reads a rule's state on first use.
local function load(rule)
  if rule.L then return end
  local get = {'GET', 'i64', 0, 'GET', 'i64', 64}
  if not rule.users then
    for _, w in ipairs(rule.windows) do
      get[#get + 1] = 'GET'; get[#get + 1] = 'u32'; get[#get + 1] = w.off
    end
  end
  local v = redis.call('BITFIELD', rule.key, unpack(get))
  rule.L, rule.U = v[1], v[2]
  if not rule.users then
    for i, w in ipairs(rule.windows) do
      w.sum = v[2 + i]
      w.slots = {}   -- position -> count, loaded lazily
      w.dirty = {}   -- positions to write back
      w.zeroed = false
    end
  end
end

local function get_slot(rule, w, pos)
  local c = w.slots[pos]
  if c == nil then
    if w.zeroed then
      c = 0
    else
      c = redis.call('BITFIELD', rule.key, 'GET', 'u32', w.off + 32 * (1 + pos))[1]
    end
    w.slots[pos] = c
  end
  return c
end

local function set_slot(w, pos, c)
  w.slots[pos] = c
  w.dirty[pos] = true
end

-- slide moves window w from clock L to newL, dropping the buckets that fell out.
local function slide(rule, w, L, newL)
  local lo_old, lo_new = floor((L - w.p) / w.b), floor((newL - w.p) / w.b)
  if lo_new <= lo_old then return end
  if lo_new - lo_old >= w.n then
    w.sum, w.slots, w.dirty, w.zeroed = 0, {}, {}, true
    return
  end
  for idx = lo_old, lo_new - 1 do
    local pos = idx % w.n
    local c = get_slot(rule, w, pos)
    if c ~= 0 then
      w.sum = w.sum - c
      set_slot(w, pos, 0)
    end
  end
end

-- observe counts one event at time te for rule and appends its reply to out.
local function observe(rule, te, user, out)
  load(rule)
  if rule.users and user == '' then
    -- Nothing to count: report the state as it is.
    out[#out + 1] = 0; out[#out + 1] = rule.L; out[#out + 1] = rule.U
    out[#out + 1] = -1; out[#out + 1] = #rule.windows
    for _, w in ipairs(rule.windows) do
      out[#out + 1] = rule.L > 0 and redis.call('ZCOUNT', rule.key .. ':u', '(' .. (rule.L - w.p), '+inf') or 0
    end
    return
  end
  local L = rule.L
  local newL = te
  if L > te then newL = L end
  local counts = {}
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
    for i, w in ipairs(rule.windows) do
      if L > 0 then slide(rule, w, L, newL) end
      local idx = floor(te / w.b)
      if idx >= floor((newL - w.p) / w.b) then
        local pos = idx % w.n
        set_slot(w, pos, get_slot(rule, w, pos) + 1)
        w.sum = w.sum + 1
      end
      counts[i] = w.sum
    end
  end
  rule.L = newL
  rule.dirty = true

  local fired, which = 0, -1
  if newL >= rule.U then
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
      rule.U = newL + cd
    end
  end
  out[#out + 1] = fired; out[#out + 1] = newL; out[#out + 1] = rule.U
  out[#out + 1] = which; out[#out + 1] = #rule.windows
  for i = 1, #rule.windows do out[#out + 1] = counts[i] end
end

-- save writes a rule's state back and renews its TTL.
local function save(rule)
  local set = {'SET', 'i64', 0, rule.L, 'SET', 'i64', 64, rule.U}
  if not rule.users then
    for _, w in ipairs(rule.windows) do
      if w.zeroed then
        redis.call('SETRANGE', rule.key, w.off / 8 + 4, string.rep('\0', 4 * w.n))
      end
      set[#set + 1] = 'SET'; set[#set + 1] = 'u32'; set[#set + 1] = w.off; set[#set + 1] = w.sum
      for pos in pairs(w.dirty) do
        set[#set + 1] = 'SET'; set[#set + 1] = 'u32'
        set[#set + 1] = w.off + 32 * (1 + pos); set[#set + 1] = w.slots[pos]
      end
    end
  end
  redis.call('BITFIELD', rule.key, unpack(set))
  local ttl = rule.maxp
  if rule.cooldown > ttl then ttl = rule.cooldown end
  ttl = ttl + 1000
  redis.call('PEXPIRE', rule.key, ttl)
  if rule.touched_users then redis.call('PEXPIRE', rule.key .. ':u', ttl) end
end

local out = {}
local nevents = tonumber(a[p])
p = p + 1
for _ = 1, nevents do
  local id, ts, user, nm = a[p], tonumber(a[p + 1]), a[p + 2], tonumber(a[p + 3])
  local first = p + 4
  p = first + nm
  local seen = false
  if id ~= '' then
    seen = redis.call('HGET', dedup_cur, id) or redis.call('HGET', dedup_prev, id)
  end
  if seen then
    local start = #out
    for v in string.gmatch(seen, '[^,]+') do out[#out + 1] = tonumber(v) end
    out[start + 2] = 1
  else
    local te = ts
    if te < 0 or te > now then te = now end
    local start = #out
    out[start + 1] = te; out[start + 2] = 0; out[start + 3] = nm
    for k = first, first + nm - 1 do
      observe(rules[tonumber(a[k])], te, user, out)
    end
    if id ~= '' then
      redis.call('HSET', dedup_cur, id, table.concat(out, ',', start + 1, #out))
    end
  end
end

for _, rule in ipairs(rules) do
  if rule.dirty then save(rule) end
end
if nevents > 0 then redis.call('PEXPIRE', dedup_cur, 2 * dedup_ttl) end
return out

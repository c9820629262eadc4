-- observe.lua: count a batch of events against the rules they matched,
-- atomically, and say which rules fire.
--
-- KEYS     one key base "<prefix>:{<project>:<group>}" per (project, group)
--          in the call. Every key of a group starts with its base, so a call
--          of one group runs on Redis Cluster; a call of several groups is
--          for a single node or Sentinel, where it saves a call per group.
-- ARGV     dedupTTL(ms) nrules
--          per rule:  key tag cooldown(ms) users(0|1) nwindows
--                     per window: threshold period(ms) bucket(ms) nbuckets
--          per group, in KEYS order: nevents
--            per event: id ts(ms, -1 = now) user nmatched rule-index...
--
-- Per (group, rule) the state is one string of little-endian integers, read
-- with one MGET for the whole call and written with one SET:
--   L (i8), the rule's clock: newest event time seen (ms)
--   U (i8), quiet until (ms)
--   per window: sum (u4), then a ring of nbuckets counts (u4); bucket idx
--   (= floor(t / bucket)) lives at position idx % nbuckets. The ring holds
--   exactly the buckets from floor((L - period) / bucket) to floor(L / bucket);
--   sum is their total, i.e. the window's count.
-- countBy users keeps a sorted set user -> newest time seen, trimmed to the
-- longest window and capped at the largest threshold (exact up to it).
--
-- Event ids are remembered per group in one hash per dedupTTL slot,
-- "<base>:m:<slot>": id -> first reply. The hash expires at the end of the
-- next slot, when its newest id is dedupTTL old, so a lookup reads this slot's
-- hash and the previous one. Its field '' marks that the expiry is set.
--
-- Reply, flat integers, per group in KEYS order, per event:
--   te dup nmatched, then per matched rule: fired L U window nwindows count...
-- An event whose id was seen within dedupTTL counts nothing. If something
-- fired then, it replays its first reply with dup=2 and each outcome led by
-- its rule's tag (a number the caller derives from the rule's id), so that
-- the firing goes to its rule even if the event's rules changed since;
-- else (dup=1) its time and empty outcomes (fired=0 L=0 U=0 window=-1
-- nwindows=0). Records from before tags replay as they were, with dup=1.
--
-- Numbers given to redis.call are formatted with '%d': Lua's own conversion
-- goes through '%.14g', which costs more than the command it feeds.

local a = ARGV
local floor, fmt = math.floor, string.format
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + floor(tonumber(clock[2]) / 1000)

local dedup_ttl = tonumber(a[1])
local slot = floor(now / dedup_ttl)
local dedup_expiry = fmt('%d', (slot + 2) * dedup_ttl - 1)
local dedup_cur, dedup_prev = fmt(':m:%d', slot), fmt(':m:%d', slot - 1)

local rules = {}
local p = 3
for r = 1, tonumber(a[2]) do
  local rule = {key = a[p], tag = a[p + 1], cooldown = tonumber(a[p + 2]),
                users = a[p + 3] == '1', windows = {}, maxp = 0, cap = 0}
  local nw = tonumber(a[p + 4])
  p = p + 5
  local format, at = {'<i8i8'}, 3 -- at: index of the next value in the state
  for i = 1, nw do
    local w = {t = tonumber(a[p]), p = tonumber(a[p + 1]), b = tonumber(a[p + 2]),
               n = tonumber(a[p + 3]), at = at}
    p = p + 4
    if not rule.users then
      format[#format + 1] = string.rep('I4', 1 + w.n)
      at = at + 1 + w.n
    end
    if w.p > rule.maxp then rule.maxp = w.p end
    if w.t > rule.cap then rule.cap = w.t end
    rule.windows[i] = w
  end
  local ttl = rule.maxp
  if rule.cooldown > ttl then ttl = rule.cooldown end
  rule.ttl = fmt('%d', ttl + 1000)
  rule.format, rule.size, rule.counts = table.concat(format), at - 1, {}
  rules[r] = rule
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

-- observe counts one event at time te for a rule's state and appends its
-- reply to out after index n; it returns the new last index.
local function observe(s, te, user, out, n)
  local rule, v = s.rule, s.v
  local L = v[1]
  if rule.users and user == '' then
    -- Nothing to count: report the state as it is.
    n = n + 1; out[n] = 0; n = n + 1; out[n] = L; n = n + 1; out[n] = v[2]
    n = n + 1; out[n] = -1; n = n + 1; out[n] = #rule.windows
    for _, w in ipairs(rule.windows) do
      n = n + 1
      out[n] = L > 0 and redis.call('ZCOUNT', s.key .. ':u', fmt('(%d', L - w.p), '+inf') or 0
    end
    return n, 0
  end
  local newL = te
  if L > te then newL = L end
  local counts = rule.counts -- reused: no table per event
  if rule.users then
    local zkey = s.key .. ':u'
    if te > newL - rule.maxp then
      redis.call('ZADD', zkey, 'GT', fmt('%d', te), user)
      redis.call('ZREMRANGEBYSCORE', zkey, '-inf', fmt('%d', newL - rule.maxp))
      local extra = redis.call('ZCARD', zkey) - rule.cap
      if extra > 0 then redis.call('ZPOPMIN', zkey, fmt('%d', extra)) end
    end
    for i, w in ipairs(rule.windows) do
      counts[i] = redis.call('ZCOUNT', zkey, fmt('(%d', newL - w.p), '+inf')
    end
    s.touched_users = true
  else
    local windows = rule.windows
    for i = 1, #windows do
      local w = windows[i]
      -- Slide even from L = 0: a state may hold events of 1970 (te = 0).
      slide(v, w, L, newL)
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
  s.dirty = true

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
local function save(s)
  redis.call('SET', s.key, struct.pack(s.rule.format, unpack(s.v)), 'PX', s.rule.ttl)
  if s.touched_users then redis.call('PEXPIRE', s.key .. ':u', s.rule.ttl) end
end

-- recall adds to seen the first replies of the ids found in the hash at
-- key, and returns the hash's mark, its field '' (no id is empty): nil when
-- there is no such hash.
local function recall(key, ids, seen)
  local mark
  for lo = 1, #ids, 1000 do
    local hi = math.min(lo + 999, #ids)
    local got = redis.call('HMGET', key, '', unpack(ids, lo, hi))
    mark = got[1]
    for i = lo, hi do
      local record = got[i - lo + 2]
      if record then seen[ids[i]] = record end
    end
  end
  return mark
end

-- A group's events start at ARGV index group.at: id ts user nmatched
-- rule-index...; a group needs the states of the rules its events matched.
local groups, states, keys = {}, {}, {}
for g = 1, #KEYS do
  local base = KEYS[g]
  local group = {base = base, nevents = tonumber(a[p]), at = p + 1, ids = {}, states = {}}
  p = p + 1
  for _ = 1, group.nevents do
    if a[p] ~= '' then group.ids[#group.ids + 1] = a[p] end
    local nm = tonumber(a[p + 3])
    for k = p + 4, p + 3 + nm do
      local r = a[k]
      if not group.states[r] then
        local rule = rules[tonumber(r)]
        local s = {rule = rule, key = base .. ':r:' .. rule.key}
        group.states[r] = s
        states[#states + 1] = s
        keys[#keys + 1] = s.key
      end
    end
    p = p + 4 + nm
  end
  groups[g] = group
end

-- Every state of the call in one MGET: v[1] = L, v[2] = U, and per window
-- v[w.at] = sum, v[w.at + 1 + pos] = the ring's count at pos.
for lo = 1, #keys, 1000 do
  local hi = math.min(lo + 999, #keys)
  local raws = redis.call('MGET', unpack(keys, lo, hi))
  for i = lo, hi do
    local s, raw = states[i], raws[i - lo + 1]
    if raw then
      s.v = {struct.unpack(s.rule.format, raw)}
    else
      local v = {}
      for k = 1, s.rule.size do v[k] = 0 end
      s.v = v
    end
  end
end

-- run observes a group's events, appending to out after index n; it returns
-- the new last index.
local function run(group, out, n)
  -- First replies of the ids seen within dedupTTL: one HMGET per slot for
  -- the whole group rather than one per event.
  local seen, ids = {}, group.ids
  local cur = group.base .. dedup_cur
  local mark
  if #ids > 0 then
    recall(group.base .. dedup_prev, ids, seen)
    mark = recall(cur, ids, seen)
  end

  local remember = {}
  local p = group.at
  for _ = 1, group.nevents do
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
      if out[start + 2] == 0 then out[start + 2] = 1 end -- untagged, from before tags
    else
      local te = ts
      if te < 0 or te > now then te = now end
      local start = n
      out[n + 1] = te; out[n + 2] = 0; out[n + 3] = nm
      n = n + 3
      local any, ends = 0, {}
      for k = first, first + nm - 1 do
        local fired
        n, fired = observe(group.states[a[k]], te, user, out, n)
        any = any + fired
        ends[#ends + 1] = n
      end
      if id ~= '' then
        -- A repeat needs its firings back, not the counts of the rest.
        if any > 0 then
          local parts, from = {fmt('%d,2,%d', te, nm)}, start + 3
          for j = 1, nm do
            parts[#parts + 1] = group.states[a[first + j - 1]].rule.tag
            parts[#parts + 1] = table.concat(out, ',', from + 1, ends[j])
            from = ends[j]
          end
          record = table.concat(parts, ',')
        else
          record = fmt('%d', te)
        end
        seen[id] = record -- the same id later in this call is a repeat too
        remember[#remember + 1] = id
        remember[#remember + 1] = record
      end
    end
  end
  if #remember > 0 then
    -- The slot's first write marks its hash and sets its expiry once: the
    -- end of the next slot, when the newest id in it is dedupTTL old.
    if not mark then remember[#remember + 1] = ''; remember[#remember + 1] = '1' end
    for lo = 1, #remember, 1000 do
      redis.call('HSET', cur, unpack(remember, lo, math.min(lo + 999, #remember)))
    end
    if not mark then redis.call('PEXPIREAT', cur, dedup_expiry) end
  end
  return n
end

local out, n = {}, 0
for _, group in ipairs(groups) do
  n = run(group, out, n)
end
for _, s in ipairs(states) do
  if s.dirty then save(s) end
end
return out

-- observe.lua: count a batch of events against the rules they matched,
-- atomically, and say which rules fire.
--
-- KEYS   one group's state key "<base>:s" per group in the call, base being
--        "<prefix>:{<hash of project and group>}"; every key the call
--        touches starts with a base, so a call of one group runs on Redis
--        Cluster. There, KEYS ends with the group's "<base>:m", a key never
--        written: while the slot migrates, the call then always misses a
--        declared key, and Redis answers TRYAGAIN instead of running it on
--        a node that holds only part of the group's keys (cluster.go).
-- ARGV   dedupTTL(ms) verbose(0|1) nrules
--        per rule:  tag id ttl(ms) cooldown(ms) users(0|1) nwindows nspikes
--                   per window: ring threshold period(ms) bucket(ms)
--                   per spike:  window(from 1) ring period(ms) bucket(ms) factor floor
--                     (the ring and period are the window's baseline's)
--        per group, in KEYS order, up to the end of ARGV: token ndone done... nevents
--          per event: key mode ts(ms, -1 = now) user nmatched rule-index...
--
-- A group's token marks this write of its state; the group's events were
-- counted already (a call sent again, a batch tried again) if its state
-- holds the token or one of the done tokens (the batch's other writes of
-- the group that come after this one). An event's key is 8 bytes: a hash of its message id (mode 1), or of its
-- body when it has no id (mode 0, or 2 when the broker redelivered it).
--
-- A group's state is one string, "<base>:s", read with one MGET for the
-- whole call and written with one SET; the width of every field is
-- state.go's (its layout constants, filled in below):
--   header   version dedup[cur] dedup[prev] tokens(4) nrings nstates npairs
--            generation (the header's last 4 bytes, at every write the last
--            one + 1 + the writing token mod 2^32: see cas.lua and
--            state.go's nextGen)
--            dedup = slot level next count inlinebytes
--   rings    per ring: tag until L npairs: a ring holds the events of one
--            (filter, period) in buckets, for every rule that counts them;
--            L is the newest event time it has seen
--   states   per rule: tag until L U: the rule's clock and the time it is
--            quiet until
--   pairs    every ring's (bucket index, count) pairs, ring after ring,
--            oldest bucket first; empty buckets are not kept
--   inline   the 8-byte keys of the ids seen in the current and previous
--            dedup slots, while a slot holds at most PAGE of them
-- Sections past their "until" (Redis time) are dropped; the key expires
-- with its last section.
--
-- Ids of a slot past PAGE move to pages "<base>:d:<slot>:<n>", strings of
-- 8-byte keys grown by linear hashing on the key's first 4 bytes, so a page
-- holds about PAGE ids whatever the rate. A slot's ids are kept until the
-- next slot ends: an id is remembered dedupTTL to 2 dedupTTL.
-- Firings are recorded by event key in the hash "<base>:f", so that a
-- repeat replays them with the same ids. countBy users keeps a sorted set
-- "<base>:u:<tag>" of user -> newest time seen.
--
-- Reply: now, then items: event rule-id kind [L U window ncounts count...]
--   counts: each window's, then each spike window's baseline's
--   kind 0: outcome that did not fire (verbose only)  1: fired
--        2: replayed firing                           3: duplicate (no fields)
-- event counts from 1 over the call's events in KEYS order.

local a = ARGV
local floor, fmt, sub, find, concat = math.floor, string.format, string.sub, string.find, table.concat
local pack, unpack_s = struct.pack, struct.unpack
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + floor(tonumber(clock[2]) / 1000)

local dedup_ttl, verbose = tonumber(a[1]), a[2] == '1'
local slot = floor(now / dedup_ttl)
local ids_until = (slot + 2) * dedup_ttl
local ids_pxat = fmt('%d', ids_until)
-- The state's layout, filled in from state.go when the script is loaded.
local PAGE = ${PAGE}
local VERSION = ${VERSION}
local HDR, HDR_SIZE = '${HEADER}', ${HEADER_SIZE}
local RING, STATE, PAIR = '${RING}', '${RULE}', '${PAIR}'

-- A rule's rings are its windows', then its spike windows' baselines, in
-- the order of its counts; a spike window w has the index of its
-- baseline's count (w.s), its factor (w.f), floor and baseline period (w.bp).
local rules, p = {}, 4
for r = 1, tonumber(a[3]) do
  local rule = {tag = tonumber(a[p]), id = tonumber(a[p + 1]), ttl = tonumber(a[p + 2]),
                cooldown = tonumber(a[p + 3]), users = a[p + 4] == '1', windows = {}, maxp = 0, cap = 0}
  local nw, ns = tonumber(a[p + 5]), tonumber(a[p + 6])
  p = p + 7
  for i = 1, nw do
    local w = {ring = tonumber(a[p]), t = tonumber(a[p + 1]), p = tonumber(a[p + 2]), b = tonumber(a[p + 3])}
    p = p + 4
    if w.p > rule.maxp then rule.maxp = w.p end
    if w.t > rule.cap then rule.cap = w.t end
    rule.windows[i] = w
  end
  local rings = {}
  for i = 1, nw do rings[i] = rule.windows[i] end
  for k = 1, ns do
    local w = rule.windows[tonumber(a[p])]
    local base = {ring = tonumber(a[p + 1]), p = tonumber(a[p + 2]), b = tonumber(a[p + 3])}
    w.s, w.f, w.floor, w.bp = nw + k, tonumber(a[p + 4]), tonumber(a[p + 5]), base.p
    rings[nw + k] = base
    p = p + 6
  end
  rule.nw, rule.rings, rule.nc = nw, rings, nw + ns
  if rule.cooldown < 1 then rule.cooldown = 1 end
  rules[r] = rule
end

-- Formats of k units, made once a call. struct takes a few thousand values
-- at most, so long runs go in chunks of CHUNK units.
local CHUNK = 500
local formats = {}
local function format(unit, k)
  local byk = formats[unit]
  if not byk then
    byk = {}
    formats[unit] = byk
  end
  local f = byk[k]
  if not f then
    f = '<' .. string.rep(unit, k)
    byk[k] = f
  end
  return f
end

-- unpack_all reads n units of width values from raw at pos: a flat table
-- of the values, and the position after them.
local function unpack_all(unit, width, n, raw, pos)
  if n <= CHUNK then
    local v = {unpack_s(format(unit, n), raw, pos)}
    pos = v[n * width + 1]
    v[n * width + 1] = nil
    return v, pos
  end
  local v = {}
  for lo = 1, n, CHUNK do
    local k = math.min(CHUNK, n - lo + 1)
    local t = {unpack_s(format(unit, k), raw, pos)}
    for i = 1, k * width do v[#v + 1] = t[i] end
    pos = t[k * width + 1]
  end
  return v, pos
end

-- pack_all writes the flat values v as units of width values.
local function pack_all(unit, width, v)
  local n = #v / width
  if n <= CHUNK then return pack(format(unit, n), unpack(v)) end
  local out = {}
  for lo = 1, n, CHUNK do
    local hi = math.min(lo + CHUNK - 1, n)
    out[#out + 1] = pack(format(unit, hi - lo + 1), unpack(v, (lo - 1) * width + 1, hi * width))
  end
  return concat(out)
end

-- load reads a group's state string into g; a missing or foreign one
-- starts empty. Rings (rh) and states (st) stay flat tables of their
-- header values, four a section; pv holds every ring's pairs, and ro the
-- offset in pv of each ring's first pair.
local function load(g, raw)
  g.cur = {slot = slot, level = -1, next = 0, count = 0, inline = ''}
  g.prev = {slot = slot - 1, level = -1, next = 0, count = 0, inline = ''}
  g.t1, g.t2, g.t3, g.t4, g.gen = 0, 0, 0, 0, 0
  if not raw or #raw < HDR_SIZE or string.byte(raw, 1) ~= VERSION then
    g.rh, g.st, g.pv, g.ro = {}, {}, {}, {}
    return
  end
  local _, cs, cl, cn, cc, cb, ps, pl, pn, pc, pb, t1, t2, t3, t4, nr, ns, np, gen, pos = unpack_s(HDR, raw)
  g.gen = gen
  g.rh, pos = unpack_all(RING, 4, nr, raw, pos)
  g.st, pos = unpack_all(STATE, 4, ns, raw, pos)
  g.pv, pos = unpack_all(PAIR, 2, np, raw, pos)
  local ro, off, rh = {}, 0, g.rh
  for i = 1, nr do
    ro[i] = off
    off = off + 2 * rh[4 * i]
  end
  g.ro = ro
  -- The previous slot is the stored current one a slot on, or the stored
  -- previous one when no id came since: save writes an empty current slot
  -- as slot 0.
  if cs == slot then
    g.cur = {slot = cs, level = cl, next = cn, count = cc, inline = sub(raw, pos, pos + cb - 1)}
  elseif cs == slot - 1 then
    g.prev = {slot = cs, level = cl, next = cn, count = cc, inline = sub(raw, pos, pos + cb - 1)}
  end
  if cs ~= slot - 1 and ps == slot - 1 then
    g.prev = {slot = ps, level = pl, next = pn, count = pc, inline = sub(raw, pos + cb, pos + cb + pb - 1)}
  end
  g.t1, g.t2, g.t3, g.t4 = t1, t2, t3, t4
end

-- A ring in use is an array, for speed: its pairs ps[2k-1] (bucket index),
-- ps[2k] (count) for k in first..last, their total, the newest time seen,
-- its period and bucket width, and until when it is kept.
local PS, FIRST, LAST, SUM, L_, P_, B_, UNTIL, SEEN = 1, 2, 3, 4, 5, 6, 7, 8, 9

-- ring returns the ring of window w in g, unpacked on first use; a ring
-- past its until starts empty.
-- find is the index in flat (sections of four values, tag first) of tag, or
-- nil: a scan while the sections are few, an index by tag once they are
-- many, so that a project of many rules costs each lookup the same.
local function find_tag(flat, index, tag)
  local n = #flat
  if n <= 64 then
    for j = 1, n, 4 do
      if flat[j] == tag then return j end
    end
    return nil, index
  end
  if not index or index.n ~= n then
    index = index or {}
    for j = (index.n or 0) + 1, n, 4 do index[flat[j]] = j end
    index.n = n
  end
  return index[tag], index
end

local function ring(g, w)
  local rh, i = g.rh, nil
  i, g.ri = find_tag(rh, g.ri, w.ring)
  if not i then
    i = #rh + 1
    rh[i], rh[i + 1], rh[i + 2], rh[i + 3] = w.ring, 0, 0, 0
  end
  local tr = g.tr
  if not tr then
    tr = {}
    g.tr = tr
  end
  local r = tr[i]
  if r then return r end
  if rh[i + 1] > now then
    local n, off = rh[i + 3], g.ro[(i + 3) / 4]
    local ps = {unpack(g.pv, off + 1, off + 2 * n)}
    local sum = 0
    for j = 2, 2 * n, 2 do sum = sum + ps[j] end
    r = {ps, 1, n, sum, rh[i + 2], w.p, w.b, 0, 0}
  else
    r = {{}, 1, 0, 0, 0, w.p, w.b, 0, 0}
  end
  tr[i] = r
  return r
end

-- add counts an event at te in ring r: the window slides to end at the
-- newest time seen, buckets before it drop out, and the event counts in its
-- bucket if that is still inside.
local function add(r, te)
  local L = r[L_]
  if te > L then
    L = te
    r[L_] = te
  end
  local b = r[B_]
  local lo = floor((L - r[P_]) / b)
  local ps, first, last = r[PS], r[FIRST], r[LAST]
  while first <= last and ps[2 * first - 1] < lo do
    r[SUM] = r[SUM] - ps[2 * first]
    first = first + 1
  end
  r[FIRST] = first
  local i = floor(te / b)
  if i < lo then return end
  r[SUM] = r[SUM] + 1
  local k = last
  while k >= first and ps[2 * k - 1] > i do k = k - 1 end
  if k >= first and ps[2 * k - 1] == i then
    ps[2 * k] = ps[2 * k] + 1
    return
  end
  -- A new bucket after position k.
  for j = last, k + 1, -1 do ps[2 * j + 1], ps[2 * j + 2] = ps[2 * j - 1], ps[2 * j] end
  ps[2 * k + 1], ps[2 * k + 2] = i, 1
  r[LAST] = last + 1
end

-- state returns the index in g.st of a rule's state (tag until L U); a
-- new one, or one past its until, starts at L = U = 0 with until 0, and is
-- kept only once it counts.
local function state(g, tag)
  local st = g.st
  local j
  j, g.si = find_tag(st, g.si, tag)
  if j then
    if st[j + 1] <= now then st[j + 1], st[j + 2], st[j + 3] = 0, 0, 0 end
    return j
  end
  j = #st + 1
  st[j], st[j + 1], st[j + 2], st[j + 3] = tag, 0, 0, 0
  return j
end

-- has reports whether the 8-byte key k is one of the keys in s.
local function has(s, k)
  local i = 1
  while true do
    local at = find(s, k, i, true)
    if not at then return false end
    if at % 8 == 1 then return true end
    i = at + 1
  end
end

local function page_key(g, d, n) return fmt('%s:d:%d:%d', g.base, d.slot, n) end

-- page is the page of a paged slot that holds key k (linear hashing).
local function page(d, k)
  local sel = unpack_s('<I4', k)
  local n = 2 ^ d.level
  local i = sel % n
  if i < d.next then i = sel % (2 * n) end
  return i
end

-- split grows a paged slot by one page: page next gives the keys that now
-- address the new page next + 2^level to it.
local function split(g, d)
  local n = 2 ^ d.level
  local from, to = d.next, d.next + n
  local src = redis.call('GET', page_key(g, d, from)) or ''
  local keep, move = {}, {}
  for i = 1, #src, 8 do
    local k = sub(src, i, i + 7)
    if unpack_s('<I4', k) % (2 * n) == from then keep[#keep + 1] = k else move[#move + 1] = k end
  end
  redis.call('SET', page_key(g, d, from), concat(keep), 'PXAT', ids_pxat)
  redis.call('SET', page_key(g, d, to), concat(move), 'PXAT', ids_pxat)
  d.next = d.next + 1
  if d.next == n then d.level, d.next = d.level + 1, 0 end
end

-- remember adds new ids' keys to the current slot.
local function remember(g, keys)
  local d = g.cur
  if d.level < 0 then
    d.inline = d.inline .. concat(keys)
  else
    local by = {}
    for _, k in ipairs(keys) do
      local n = page(d, k)
      by[n] = by[n] or {}
      by[n][#by[n] + 1] = k
    end
    for n, ks in pairs(by) do redis.call('APPEND', page_key(g, d, n), concat(ks)) end
  end
  d.count = d.count + #keys
  if d.level < 0 and d.count > PAGE then
    redis.call('SET', page_key(g, d, 0), d.inline, 'PXAT', ids_pxat)
    d.inline, d.level, d.next = '', 0, 0
  end
  while d.level >= 0 and d.count > PAGE * (2 ^ d.level + d.next) do split(g, d) end
end

-- recall marks in dup the keys of ids that slot d already holds; pages to
-- read are gathered in fetch (key -> the keys to look for there).
local function recall(g, d, keys, dup, fetch)
  if d.count == 0 then return fetch end
  for _, k in ipairs(keys) do
    if d.level < 0 then
      if has(d.inline, k) then dup[k] = true end
    else
      fetch = fetch or {}
      local key = page_key(g, d, page(d, k))
      local ks = fetch[key]
      if not ks then
        ks = {}
        fetch[key] = ks
      end
      ks[#ks + 1] = k
    end
  end
  return fetch
end

-- seen is the set of keys of ids that g's current and previous slots hold.
local function seen(g, keys)
  local dup = {}
  local fetch = recall(g, g.cur, keys, dup, nil)
  fetch = recall(g, g.prev, keys, dup, fetch)
  if not fetch then return dup end
  local names = {}
  for key in pairs(fetch) do names[#names + 1] = key end
  local pages = redis.call('MGET', unpack(names))
  for i, key in ipairs(names) do
    local s = pages[i]
    if s then
      for _, k in ipairs(fetch[key]) do
        if has(s, k) then dup[k] = true end
      end
    end
  end
  return dup
end

-- The groups of the call: their events, and the ids to look up.
local groups, gi = {}, 0
while p <= #a do
  gi = gi + 1
  local g = {base = string.sub(KEYS[gi], 1, -3), token = tonumber(a[p]), done = {}, ids = {}}
  g.done[g.token] = true
  local nd = tonumber(a[p + 1])
  for i = p + 2, p + 1 + nd do g.done[tonumber(a[i])] = true end
  p = p + 2 + nd
  g.n, g.at = tonumber(a[p]), p + 1
  p = p + 1
  for _ = 1, g.n do
    local nm = tonumber(a[p + 4])
    if a[p + 1] == '1' then g.ids[#g.ids + 1] = a[p] end
    p = p + 5 + nm
  end
  groups[gi] = g
end
do
  local skeys = {}
  for gi, g in ipairs(groups) do skeys[gi] = g.base .. ':s' end
  local raws = redis.call('MGET', unpack(skeys))
  for gi, g in ipairs(groups) do load(g, raws[gi]) end
end

local out, n, e = {now}, 1, 0

local function emit(ev, id, kind, L, U, which, counts, nw)
  out[n + 1], out[n + 2], out[n + 3] = ev, id, kind
  n = n + 3
  if kind == 3 then return end
  out[n + 1], out[n + 2], out[n + 3], out[n + 4] = L, U, which, nw
  n = n + 4
  for i = 1, nw do out[n + i] = counts[i] end
  n = n + nw
end

-- replay emits the firings recorded for an event: "id,L,U,window,nw,count..."
-- items joined by commas; a rule that fired now (skip) is not replayed.
local function replay(ev, record, skip)
  if not record then return end
  local v = {}
  for x in string.gmatch(record, '[^,]+') do v[#v + 1] = tonumber(x) end
  local i = 1
  while i <= #v do
    local nw = v[i + 4]
    if not (skip and skip[v[i]]) then
      local c = {}
      for j = 1, nw do c[j] = v[i + 4 + j] end
      emit(ev, v[i], 2, v[i + 1], v[i + 2], v[i + 3], c, nw)
    end
    i = i + 5 + nw
  end
end

local counts = {}

-- count observes one event at te for one rule, fills counts and returns the
-- window that fired (0-based; -1 for a rule without windows) or nil, and
-- the index of the rule's state in g.st.
local function count(g, rule, te, user)
  local j = state(g, rule.tag)
  local st = g.st
  local windows = rule.windows
  if rule.users then
    local zkey = fmt('%s:u:%d', g.base, rule.tag)
    local L = st[j + 2]
    if user == '' then
      -- Nothing to count: the state as it is.
      for i = 1, rule.nw do
        counts[i] = L > 0 and redis.call('ZCOUNT', zkey, fmt('(%d', L - windows[i].p), '+inf') or 0
      end
      return nil, j
    end
    if te > L then L = te end
    if te > L - rule.maxp then
      redis.call('ZADD', zkey, 'GT', fmt('%d', te), user)
      redis.call('ZREMRANGEBYSCORE', zkey, '-inf', fmt('%d', L - rule.maxp))
      local extra = redis.call('ZCARD', zkey) - rule.cap
      if extra > 0 then redis.call('ZPOPMIN', zkey, fmt('%d', extra)) end
    end
    for i = 1, rule.nw do
      counts[i] = redis.call('ZCOUNT', zkey, fmt('(%d', L - windows[i].p), '+inf')
    end
    redis.call('PEXPIRE', zkey, fmt('%d', rule.ttl))
  else
    local rings = rule.rings
    for i = 1, rule.nc do counts[i] = ring(g, rings[i])[SUM] end
  end
  if te > st[j + 2] then st[j + 2] = te end
  st[j + 1] = now + rule.ttl
  local L = st[j + 2]
  if L < st[j + 3] then return nil, j end
  local which
  if rule.nw == 0 then which = -1 end
  for i = 1, rule.nw do
    local w, c = windows[i], counts[i]
    -- A spike window also needs c >= factor * max(base * period / bp,
    -- floor), worked without a division as rules.Window.Reached does.
    if c >= w.t and (not w.f or c * w.bp >= w.f * math.max(counts[w.s] * w.p, w.floor * w.bp)) then
      which = i - 1
      break
    end
  end
  if which then st[j + 3] = L + rule.cooldown end
  return which, j
end

for _, g in ipairs(groups) do
  local d = g.done
  local replayed = d[g.t1] or d[g.t2] or d[g.t3] or d[g.t4]
  if not replayed then g.t1, g.t2, g.t3, g.t4 = g.token, g.t1, g.t2, g.t3 end

  -- Which events repeat, and the records of their firings.
  local dup
  if not replayed and #g.ids > 0 then dup = seen(g, g.ids) end
  local want
  local q = g.at
  for _ = 1, g.n do
    local k, mode = a[q], a[q + 1]
    if replayed or mode == '2' or (dup and dup[k]) then
      want = want or {}
      want[#want + 1] = k
    end
    q = q + 5 + tonumber(a[q + 4])
  end
  local records = {}
  if want then
    local got = redis.call('HMGET', g.base .. ':f', unpack(want))
    for i, k in ipairs(want) do records[k] = got[i] or nil end
  end

  local new, fired_records, fired_order
  q = g.at
  for _ = 1, g.n do
    local k, mode, ts, user, nm = a[q], a[q + 1], tonumber(a[q + 2]), a[q + 3], tonumber(a[q + 4])
    local first = q + 5
    q = first + nm
    e = e + 1
    if replayed or (mode == '1' and ((dup and dup[k]) or (new and new[k]))) then
      emit(e, 0, 3)
      replay(e, records[k])
    else
      if mode == '1' then
        new = new or {}
        new[k] = true
        new[#new + 1] = k
      end
      local te = ts
      if te < 0 or te > now then te = now end
      -- Rings first, once each, however many of the event's rules share them.
      for j = first, first + nm - 1 do
        local rule = rules[tonumber(a[j])]
        if not rule.users then
          for i = 1, rule.nc do
            local r = ring(g, rule.rings[i])
            if r[SEEN] ~= e then
              r[SEEN] = e
              add(r, te)
              r[UNTIL] = now + r[P_] + r[B_] + 1000
            end
          end
        end
      end
      local fired, items
      for j = first, first + nm - 1 do
        local rule = rules[tonumber(a[j])]
        local nw = rule.nc
        local which, s = count(g, rule, te, user)
        local st = g.st
        if which then
          fired, items = fired or {}, items or {}
          fired[rule.id] = true
          items[#items + 1] = fmt('%d,%d,%d,%d,%d', rule.id, st[s + 2], st[s + 3], which, nw)
          for i = 1, nw do items[#items + 1] = fmt('%d', counts[i]) end
        end
        if which or verbose then emit(e, rule.id, which and 1 or 0, st[s + 2], st[s + 3], which or -1, counts, nw) end
      end
      local before = records[k]
      if fired then
        -- A later repeat of this event, in this call or after, replays these.
        local rec = concat(items, ',')
        fired_records, fired_order = fired_records or {}, fired_order or {}
        if not fired_records[k] then fired_order[#fired_order + 1] = k end
        records[k], fired_records[k] = rec, rec
      end
      if mode == '2' then replay(e, before, fired) end
    end
  end
  if new then remember(g, new) end
  if fired_order then
    local args = {}
    for _, k in ipairs(fired_order) do
      args[#args + 1] = k
      args[#args + 1] = fired_records[k]
    end
    redis.call('HSET', g.base .. ':f', unpack(args))
    redis.call('PEXPIREAT', g.base .. ':f', ids_pxat)
  end
end

local EMPTY = {slot = 0, level = -1, next = 0, count = 0, inline = ''}

-- save writes a group's state back, leaving out what is past its until.
local function save(g)
  local expiry = 0
  local c, pv = g.cur, g.prev
  if c.count > 0 then expiry = ids_until else c = EMPTY end
  if pv.count > 0 and pv.slot == slot - 1 then
    if ids_until - dedup_ttl > expiry then expiry = ids_until - dedup_ttl end
  else
    pv = EMPTY
  end
  local rh, tr, ro, pv_ = g.rh, g.tr, g.ro, g.pv
  local orh, opv, live = rh, {}, true
  for i = 1, #rh, 4 do
    local r = tr and tr[i]
    if r then
      local m = r[LAST] - r[FIRST] + 1
      rh[i + 1], rh[i + 2], rh[i + 3] = r[UNTIL], r[L_], m
      opv[#opv + 1] = pack(format(PAIR, m), unpack(r[PS], 2 * r[FIRST] - 1, 2 * r[LAST]))
    elseif rh[i + 1] > now then
      local off, m = ro[(i + 3) / 4], rh[i + 3]
      opv[#opv + 1] = pack(format(PAIR, m), unpack(pv_, off + 1, off + 2 * m))
    else
      live = false
      opv[#opv + 1] = ''
    end
    if rh[i + 1] > expiry then expiry = rh[i + 1] end
  end
  local npairs = 0
  if not live then
    -- Some ring is past its until: keep only the live ones.
    orh = {}
    local keep = {}
    for i = 1, #rh, 4 do
      if rh[i + 1] > now then
        local m = #orh
        orh[m + 1], orh[m + 2], orh[m + 3], orh[m + 4] = rh[i], rh[i + 1], rh[i + 2], rh[i + 3]
        keep[#keep + 1] = opv[(i + 3) / 4]
      end
    end
    opv = keep
  end
  for i = 4, #orh, 4 do npairs = npairs + orh[i] end
  local st, ost = g.st, g.st
  for j = 1, #st, 4 do
    if st[j + 1] <= now then
      -- Some state is past its until: keep only the live ones.
      ost = {}
      for k = 1, #st, 4 do
        if st[k + 1] > now then
          local m = #ost
          ost[m + 1], ost[m + 2], ost[m + 3], ost[m + 4] = st[k], st[k + 1], st[k + 2], st[k + 3]
        end
      end
      break
    end
  end
  for j = 2, #ost, 4 do
    if ost[j] > expiry then expiry = ost[j] end
  end
  local hdr = pack(HDR, VERSION, c.slot, c.level, c.next, c.count, #c.inline,
                   pv.slot, pv.level, pv.next, pv.count, #pv.inline, g.t1, g.t2, g.t3, g.t4,
                   #orh / 4, #ost / 4, npairs, (g.gen + 1 + g.t1 % 4294967296) % 4294967296)
  if expiry <= now then expiry = now + 1000 end
  redis.call('SET', g.base .. ':s', hdr .. pack_all(RING, 4, orh) .. pack_all(STATE, 4, ost) ..
             concat(opv) .. c.inline .. pv.inline, 'PXAT', fmt('%d', expiry))
end

for _, g in ipairs(groups) do save(g) end
return out

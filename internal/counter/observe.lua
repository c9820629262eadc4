-- observe.lua: count a batch of events against the rules they matched,
-- atomically, and say which rules fire.
--
-- KEYS   one base "<prefix>:{<hash of project and group>}" per group in the
--        call; every key the call touches starts with a base of KEYS, so a
--        call of one group runs on Redis Cluster.
-- ARGV   dedupTTL(ms) token verbose(0|1) nrules
--        per rule:  tag id ttl(ms) cooldown(ms) users(0|1) nwindows
--                   per window: ring threshold period(ms) bucket(ms)
--        per group, in KEYS order: nevents
--          per event: key mode ts(ms, -1 = now) user nmatched rule-index...
--
-- An event's key is 8 bytes: a hash of its message id (mode 1), or of its
-- body when it has no id (mode 0, or 2 when the broker redelivered it).
--
-- A group's state is one string, "<base>:s", read with one MGET for the
-- whole call and written with one SET:
--   header   version(1) dedup[cur] dedup[prev] tokens(4) nrings nstates
--            dedup = slot level next count inlinebytes
--   inline   the 8-byte keys of the ids seen in the current and previous
--            dedup slots, while a slot holds at most PAGE of them
--   rings    tag until L npairs, then npairs (bucket index, count), oldest
--            first: the events in buckets of one (filter, period), shared by
--            every rule that counts them; L is the newest event time seen
--   states   tag until L U: a rule's clock and the time it is quiet until
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
-- Reply: now, then items: event rule-id kind [L U window nwindows count...]
--   kind 0: outcome that did not fire (verbose only)  1: fired
--        2: replayed firing                           3: duplicate (no fields)
-- event counts from 1 over the call's events in KEYS order.

local a = ARGV
local floor, fmt, sub, find, concat = math.floor, string.format, string.sub, string.find, table.concat
local pack, unpack_s = struct.pack, struct.unpack
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + floor(tonumber(clock[2]) / 1000)

local dedup_ttl, token, verbose = tonumber(a[1]), tonumber(a[2]), a[3] == '1'
local slot = floor(now / dedup_ttl)
local ids_until = (slot + 2) * dedup_ttl
local PAGE = 128
local HDR = '<Bi8i1I2I4I4i8i1I2I4I4i8i8i8i8I2I2'
local RING, STATE = '<i8i8i8I2', '<i8i8i8i8'

local rules, p = {}, 5
for r = 1, tonumber(a[4]) do
  local rule = {tag = tonumber(a[p]), id = tonumber(a[p + 1]), ttl = tonumber(a[p + 2]),
                cooldown = tonumber(a[p + 3]), users = a[p + 4] == '1', windows = {}, maxp = 0, cap = 0}
  local nw = tonumber(a[p + 5])
  p = p + 6
  for i = 1, nw do
    local w = {ring = tonumber(a[p]), t = tonumber(a[p + 1]), p = tonumber(a[p + 2]), b = tonumber(a[p + 3])}
    p = p + 4
    if w.p > rule.maxp then rule.maxp = w.p end
    if w.t > rule.cap then rule.cap = w.t end
    rule.windows[i] = w
  end
  if rule.cooldown < 1 then rule.cooldown = 1 end
  rules[r] = rule
end

local function empty_dedup(s) return {slot = s, level = -1, next = 0, count = 0, inline = ''} end

-- load reads a group's state string; a missing or foreign one starts empty.
local function load(g, raw)
  g.rings, g.states, g.order_r, g.order_s = {}, {}, {}, {}
  g.cur, g.prev, g.tokens = empty_dedup(slot), empty_dedup(slot - 1), {0, 0, 0, 0}
  if not raw or #raw < 75 or string.byte(raw, 1) ~= 1 then return end
  local _, cs, cl, cn, cc, cb, ps, pl, pn, pc, pb, t1, t2, t3, t4, nr, ns, pos = unpack_s(HDR, raw)
  local cur = {slot = cs, level = cl, next = cn, count = cc, inline = sub(raw, pos, pos + cb - 1)}
  pos = pos + cb
  local prev = {slot = ps, level = pl, next = pn, count = pc, inline = sub(raw, pos, pos + pb - 1)}
  pos = pos + pb
  if cur.slot == slot then
    g.cur = cur
    if prev.slot == slot - 1 then g.prev = prev end
  elseif cur.slot == slot - 1 then
    g.prev = cur
  end
  g.tokens = {t1, t2, t3, t4}
  for _ = 1, nr do
    local tag, untl, L, n = unpack_s(RING, raw, pos)
    local len = 26 + 12 * n
    if untl > now then
      g.rings[tag] = {tag = tag, untl = untl, L = L, n = n, at = pos, raw = raw}
      g.order_r[#g.order_r + 1] = tag
    end
    pos = pos + len
  end
  for _ = 1, ns do
    local tag, untl, L, U = unpack_s(STATE, raw, pos)
    if untl > now then
      g.states[tag] = {tag = tag, untl = untl, L = L, U = U}
      g.order_s[#g.order_s + 1] = tag
    end
    pos = pos + 32
  end
end

-- ring returns a group's ring of that tag, its pairs unpacked on first use:
-- idx[first..last] and cnt[first..last], sum their total.
local function ring(g, tag, w)
  local r = g.rings[tag]
  if not r then
    r = {tag = tag, L = 0, n = 0}
    g.rings[tag] = r
    g.order_r[#g.order_r + 1] = tag
  end
  if not r.idx then
    local idx, cnt, sum = {}, {}, 0
    if r.n > 0 then
      local v = {unpack_s(string.rep('i8I4', r.n), r.raw, r.at + 26)}
      for i = 1, r.n do
        idx[i], cnt[i] = v[2 * i - 1], v[2 * i]
        sum = sum + cnt[i]
      end
    end
    r.idx, r.cnt, r.first, r.last, r.sum, r.p, r.b, r.raw = idx, cnt, 1, r.n, sum, w.p, w.b, nil
  end
  return r
end

-- add counts an event at te in ring r: the window slides to end at the
-- newest time seen, buckets before it drop out, and the event counts in its
-- bucket if that is still inside.
local function add(r, te)
  local L = r.L
  if te > L then L = te end
  r.L = L
  local lo = floor((L - r.p) / r.b)
  local idx, cnt = r.idx, r.cnt
  while r.first <= r.last and idx[r.first] < lo do
    r.sum = r.sum - cnt[r.first]
    r.first = r.first + 1
  end
  local i = floor(te / r.b)
  if i < lo then return end
  r.sum = r.sum + 1
  local k = r.last
  while k >= r.first and idx[k] > i do k = k - 1 end
  if k >= r.first and idx[k] == i then
    cnt[k] = cnt[k] + 1
    return
  end
  -- a new bucket after position k
  for j = r.last, k + 1, -1 do idx[j + 1], cnt[j + 1] = idx[j], cnt[j] end
  idx[k + 1], cnt[k + 1] = i, 1
  r.last = r.last + 1
end

local function state(g, tag)
  local s = g.states[tag]
  if not s then
    s = {tag = tag, L = 0, U = 0}
    g.states[tag] = s
    g.order_s[#g.order_s + 1] = tag
  end
  return s
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
  redis.call('SET', page_key(g, d, from), concat(keep), 'PXAT', fmt('%d', ids_until))
  redis.call('SET', page_key(g, d, to), concat(move), 'PXAT', fmt('%d', ids_until))
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
    redis.call('SET', page_key(g, d, 0), d.inline, 'PXAT', fmt('%d', ids_until))
    d.inline, d.level, d.next = '', 0, 0
  end
  while d.level >= 0 and d.count > PAGE * (2 ^ d.level + d.next) do split(g, d) end
end

-- recall marks in dup the keys of ids that the group's slots already hold.
local function recall(g, keys, dup)
  local fetch, where = {}, {}
  for _, d in ipairs({g.cur, g.prev}) do
    if d.count > 0 then
      for _, k in ipairs(keys) do
        if d.level < 0 then
          if has(d.inline, k) then dup[k] = true end
        else
          local key = page_key(g, d, page(d, k))
          if not where[key] then
            where[key] = {}
            fetch[#fetch + 1] = key
          end
          where[key][#where[key] + 1] = k
        end
      end
    end
  end
  if #fetch == 0 then return end
  local pages = redis.call('MGET', unpack(fetch))
  for i, key in ipairs(fetch) do
    local s = pages[i]
    if s then
      for _, k in ipairs(where[key]) do
        if has(s, k) then dup[k] = true end
      end
    end
  end
end

-- Plan the groups: their events, and the ids to look up.
local groups = {}
for gi = 1, #KEYS do
  local g = {base = KEYS[gi], n = tonumber(a[p]), at = p + 1, ids = {}, records = {}}
  p = p + 1
  for _ = 1, g.n do
    local nm = tonumber(a[p + 4])
    if a[p + 1] == '1' then g.ids[#g.ids + 1] = a[p] end
    p = p + 5 + nm
  end
  groups[gi] = g
end
local skeys = {}
for gi, g in ipairs(groups) do skeys[gi] = g.base .. ':s' end
local raws = redis.call('MGET', unpack(skeys))
for gi, g in ipairs(groups) do load(g, raws[gi]) end

local out, n, e = {now}, 1, 0

local function emit(ev, tag, kind, L, U, which, counts, nw)
  out[n + 1], out[n + 2], out[n + 3] = ev, tag, kind
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
-- window that fired (0-based; -1 for a rule without windows), or nil.
local function count(g, rule, te, user)
  local s = state(g, rule.tag)
  if rule.users then
    local zkey = fmt('%s:u:%d', g.base, rule.tag)
    if user == '' then
      -- Nothing to count: the state as it is.
      for i, w in ipairs(rule.windows) do
        counts[i] = s.L > 0 and redis.call('ZCOUNT', zkey, fmt('(%d', s.L - w.p), '+inf') or 0
      end
      return nil, s
    end
    local L = s.L
    if te > L then L = te end
    if te > L - rule.maxp then
      redis.call('ZADD', zkey, 'GT', fmt('%d', te), user)
      redis.call('ZREMRANGEBYSCORE', zkey, '-inf', fmt('%d', L - rule.maxp))
      local extra = redis.call('ZCARD', zkey) - rule.cap
      if extra > 0 then redis.call('ZPOPMIN', zkey, fmt('%d', extra)) end
    end
    for i, w in ipairs(rule.windows) do
      counts[i] = redis.call('ZCOUNT', zkey, fmt('(%d', L - w.p), '+inf')
    end
    redis.call('PEXPIRE', zkey, fmt('%d', rule.ttl))
  else
    for i, w in ipairs(rule.windows) do counts[i] = g.rings[w.ring].sum end
  end
  if te > s.L then s.L = te end
  s.untl = now + rule.ttl
  if s.L < s.U then return nil, s end
  local which
  if #rule.windows == 0 then which = -1 end
  for i, w in ipairs(rule.windows) do
    if counts[i] >= w.t then which = i - 1; break end
  end
  if which then s.U = s.L + rule.cooldown end
  return which, s
end

for _, g in ipairs(groups) do
  local replayed = false
  for _, t in ipairs(g.tokens) do
    if t == token then replayed = true end
  end
  if not replayed then g.tokens = {token, g.tokens[1], g.tokens[2], g.tokens[3]} end

  -- Which events repeat, and the records of their firings.
  local dup, want = {}, {}
  if not replayed and #g.ids > 0 then recall(g, g.ids, dup) end
  local q = g.at
  for _ = 1, g.n do
    local k, mode = a[q], a[q + 1]
    if replayed or mode == '2' or dup[k] then want[#want + 1] = k end
    q = q + 5 + tonumber(a[q + 4])
  end
  local records = {}
  if #want > 0 then
    local got = redis.call('HMGET', g.base .. ':f', unpack(want))
    for i, k in ipairs(want) do records[k] = got[i] or nil end
  end

  local new, fired_records, fired_order = {}, {}, {}
  q = g.at
  for _ = 1, g.n do
    local k, mode, ts, user, nm = a[q], a[q + 1], tonumber(a[q + 2]), a[q + 3], tonumber(a[q + 4])
    local first = q + 5
    q = first + nm
    e = e + 1
    if replayed or (mode == '1' and (dup[k] or new[k])) then
      emit(e, 0, 3)
      replay(e, records[k])
    else
      if mode == '1' then
        new[k] = true
        new[#new + 1] = k
      end
      local te = ts
      if te < 0 or te > now then te = now end
      -- Rings first, once each, however many of the event's rules share them.
      for j = first, first + nm - 1 do
        local rule = rules[tonumber(a[j])]
        if not rule.users then
          for _, w in ipairs(rule.windows) do
            local r = ring(g, w.ring, w)
            if r.seen ~= e then
              r.seen = e
              add(r, te)
              local u = now + r.p + r.b + 1000
              if not r.untl or u > r.untl then r.untl = u end
            end
          end
        end
      end
      local fired, items = nil, {}
      for j = first, first + nm - 1 do
        local rule = rules[tonumber(a[j])]
        local nw = #rule.windows
        local which, s = count(g, rule, te, user)
        if which then
          fired = fired or {}
          fired[rule.id] = true
          items[#items + 1] = fmt('%d,%d,%d,%d,%d', rule.id, s.L, s.U, which, nw)
          for i = 1, nw do items[#items + 1] = fmt('%d', counts[i]) end
        end
        if which or verbose then emit(e, rule.id, which and 1 or 0, s.L, s.U, which or -1, counts, nw) end
      end
      local before = records[k]
      if fired then
        -- A later repeat of this event, in this call or after, replays these.
        local rec = concat(items, ',')
        if not fired_records[k] then fired_order[#fired_order + 1] = k end
        records[k], fired_records[k] = rec, rec
      end
      if mode == '2' then replay(e, before, fired) end
    end
  end
  if #new > 0 then remember(g, new) end
  if #fired_order > 0 then
    local args = {}
    for _, k in ipairs(fired_order) do
      args[#args + 1] = k
      args[#args + 1] = fired_records[k]
    end
    redis.call('HSET', g.base .. ':f', unpack(args))
    redis.call('PEXPIREAT', g.base .. ':f', fmt('%d', ids_until))
  end
end

-- save writes a group's state back, dropping what expired.
local function save(g)
  local parts, expiry = {}, 0
  local function dedup(d)
    if d.count > 0 and d.slot >= slot - 1 then
      if (d.slot + 2) * dedup_ttl > expiry then expiry = (d.slot + 2) * dedup_ttl end
      return d
    end
    return empty_dedup(0)
  end
  local c, pv = dedup(g.cur), dedup(g.prev)
  local body = {}
  local nr, ns = 0, 0
  for _, tag in ipairs(g.order_r) do
    local r = g.rings[tag]
    if r.idx then
      local v, m = {r.tag, r.untl, r.L, 0}, 0
      for i = r.first, r.last do
        v[#v + 1], v[#v + 2] = r.idx[i], r.cnt[i]
        m = m + 1
      end
      v[4] = m
      body[#body + 1] = pack(RING .. string.rep('i8I4', m), unpack(v))
    else
      body[#body + 1] = sub(r.raw, r.at, r.at + 25 + 12 * r.n)
    end
    if r.untl > expiry then expiry = r.untl end
    nr = nr + 1
  end
  for _, tag in ipairs(g.order_s) do
    local s = g.states[tag]
    if s.untl then
      body[#body + 1] = pack(STATE, s.tag, s.untl, s.L, s.U)
      if s.untl > expiry then expiry = s.untl end
      ns = ns + 1
    end
  end
  local t = g.tokens
  local hdr = pack(HDR, 1, c.slot, c.level, c.next, c.count, #c.inline,
                   pv.slot, pv.level, pv.next, pv.count, #pv.inline, t[1], t[2], t[3], t[4], nr, ns)
  if expiry <= now then expiry = now + 1000 end
  redis.call('SET', g.base .. ':s', hdr .. c.inline .. pv.inline .. concat(body), 'PXAT', fmt('%d', expiry))
end

for _, g in ipairs(groups) do save(g) end
return out

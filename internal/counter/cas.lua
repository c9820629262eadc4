-- cas.lua: store the states a worker counted itself (state.go), each only
-- if its group's state is still the one the worker read: the generation
-- (the header's last 4 bytes, at state.go's genOffset, filled in when the
-- script is loaded) unchanged (every write makes a new one, from the last
-- and the writing batch's token), or the state still missing. A group
-- whose state changed meanwhile is left as it is, and its state answered,
-- for the worker to count again from.
--
-- KEYS   one state key "<base>:s" per group, base being "<prefix>:{…}";
--        on Cluster then "<base>:m", never written, so that Redis answers
--        TRYAGAIN rather than run the call while the slot migrates
--        (observe.lua and cluster.go say why)
-- ARGV   idsUntil(ms), then per group, in KEYS order, up to the end of ARGV:
--          generation (as read: 4 bytes, or '' for none) state expiry(ms)
--          nrecords, then nrecords pairs of event key and firing record
--          npages, then npages of: "set" or "append", page key, ids
--          (pages of ids are written with their state; so their content is
--          what the worker read as long as the generation is)
-- Reply  per group: 1 stored, or the state now (a string, '' for none):
--        changed meanwhile, nothing written

local a, out, p, i = ARGV, {}, 2, 0
while p <= #a do
  i = i + 1
  local key, nrec = KEYS[i], tonumber(a[p + 3])
  local base = string.sub(key, 1, -3)
  local q = p + 4 + 2 * nrec
  local npages = tonumber(a[q])
  if redis.call('GETRANGE', key, ${GEN_FIRST}, ${GEN_LAST}) == a[p] then
    redis.call('SET', key, a[p + 1], 'PXAT', a[p + 2])
    if nrec > 0 then
      redis.call('HSET', base .. ':f', unpack(a, p + 4, q - 1))
      redis.call('PEXPIREAT', base .. ':f', a[1])
    end
    for j = q + 1, q + 3 * npages, 3 do
      if a[j] == 'set' then
        redis.call('SET', a[j + 1], a[j + 2], 'PXAT', a[1])
      else
        redis.call('APPEND', a[j + 1], a[j + 2])
      end
    end
    out[i] = 1
  else
    out[i] = redis.call('GET', key) or ''
  end
  p = q + 1 + 3 * npages
end
return out

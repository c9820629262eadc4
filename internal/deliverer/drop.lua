-- drop.lua: delete a digest in flight once it is settled, unless it is no
-- longer the one that was read: a worker that took long to settle a digest
-- another worker had already sent must not delete the next digest, whose
-- in-flight copy is what a retry or a crash of its sender relies on.
-- KEYS[1] digest in flight; ARGV[1] its generation as read ('' = none)
if (redis.call('HGET', KEYS[1], '#') or '') == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0

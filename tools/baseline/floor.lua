-- The floor, for comparison only: not a counter, but the Redis commands an
-- idempotent windowed counter cannot do without for one event, and no logic
-- between them: the server's clock, read the state, check and record the
-- event's id in one command, write the state back. What it costs a call is
-- the least any engine with Klaxon's guarantees pays.
-- KEYS[1] state key; ARGV: now(ms) period(ms) threshold id
-- Returns 0: it never decides anything.
redis.call('TIME')
redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1] .. ':m:' .. ARGV[4], ARGV[1], 'NX', 'GET', 'PX', '600000')
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 0

-- Write step ARGV[3] to the hash KEYS[2] for the holder of the lease record
-- KEYS[1] (owner ARGV[1], fence ARGV[2]) while its lease lasts by Redis's
-- clock; keep the hash ARGV[5] ms. ARGV[6] says what: `r` records the
-- step's result (ARGV[4]: `<name>\n<result>`, in the field of its number),
-- `m` marks it started (ARGV[4]: `<number>\n<fence>\n<name>`, in the field
-- `started`; a mark of the same step already there is kept). 1: written
-- (or this very step recorded before); 0: the lease is no longer this
-- holder's, or the step is not the next one.
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
-- A held record: P<fence>.<ttl>:<owner>|<lease>:<tail>:<fingerprint>.
local f, o, tail = string.match(v, '^P(%d+)%.%d+:([^|]*)|%d+:(%d+):')
if f ~= ARGV[2] or o ~= ARGV[1] then return 0 end
if redis.call('PTTL', KEYS[1]) - tonumber(tail) <= 0 then return 0 end
-- Every field but `started` is a recorded step.
local n, len = tonumber(ARGV[3]), redis.call('HLEN', KEYS[2]) - redis.call('HEXISTS', KEYS[2], 'started')
if ARGV[6] == 'm' then
  if n ~= len then return 0 end
  local mark = redis.call('HGET', KEYS[2], 'started')
  if mark and string.match(mark, '^(%d+)\n') == ARGV[3] then return 1 end
  redis.call('HSET', KEYS[2], 'started', ARGV[4])
else
  if n < len then return redis.call('HGET', KEYS[2], ARGV[3]) == ARGV[4] and 1 or 0 end
  if n > len then return 0 end
  redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
end
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return 1

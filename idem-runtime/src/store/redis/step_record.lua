-- Record step ARGV[3] (its value ARGV[4]: `<name>\n<result>`) in the hash
-- KEYS[2] for the holder of the lease record KEYS[1] (owner ARGV[1], fence
-- ARGV[2]) while its lease lasts by Redis's clock; keep the hash ARGV[5]
-- ms. 1: recorded (or this very step recorded before); 0: the lease is no
-- longer this holder's, or the step is not the next one.
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
-- A held record: P<fence>.<ttl>:<owner>|<lease>:<tail>:<fingerprint>.
local f, o, tail = string.match(v, '^P(%d+)%.%d+:([^|]*)|%d+:(%d+):')
if f ~= ARGV[2] or o ~= ARGV[1] then return 0 end
if redis.call('PTTL', KEYS[1]) - tonumber(tail) <= 0 then return 0 end
local n, len = tonumber(ARGV[3]), redis.call('HLEN', KEYS[2])
if n < len then return redis.call('HGET', KEYS[2], ARGV[3]) == ARGV[4] and 1 or 0 end
if n > len then return 0 end
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return 1

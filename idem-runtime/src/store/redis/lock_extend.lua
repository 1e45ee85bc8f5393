-- Reset a lock's TTL to ARGV[2] ms if ARGV[1] still owns it.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0

-- Take a lock and count its fencing token, in one step.
-- KEYS[1]: the lock; KEYS[2]: its fencing counter (same hash tag, same slot).
-- ARGV[1]: owner id; ARGV[2]: TTL in ms; ARGV[3]: how long the counter
-- outlives its last grant, in ms.
-- Replies {1, fence} when taken, {0, ms left} when held by someone.
-- Safe to repeat: the same owner finds the lock its first attempt took and
-- is granted again with the fence it got (a cluster client resends a
-- command whose connection dropped, reply or not).
--
-- Everything is read and checked before anything is written: a counter key
-- of another type fails GET, and one that holds no counter INCR could count
-- is refused, so a failed call leaves no lock behind.
local counter = redis.call('GET', KEYS[2])
if counter and not (string.match(counter, '^%d+$') and #counter <= 18) then
  return redis.error_reply('ERR the fencing counter ' .. KEYS[2] .. ' holds no counter')
end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if counter and redis.call('GET', KEYS[1]) == ARGV[1] then
    -- The full TTL again, as a fresh grant has: the owner counts from now.
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, counter}
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
if not counter then
  -- Seeded from the server's clock in microseconds, so tokens keep
  -- increasing after a counter was lost (expired unused, or flushed).
  local t = redis.call('TIME')
  redis.call('SET', KEYS[2], t[1] .. string.format('%06d', tonumber(t[2])))
end
local fence = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {1, fence}

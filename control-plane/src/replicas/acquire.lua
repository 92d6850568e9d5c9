-- Acquires or renews the leader lease.
-- KEYS[1]: the lease ("<replica id> <fence>", expiring)
-- KEYS[2]: the fence counter
-- ARGV[1]: this replica's id; ARGV[2]: lease in ms
-- ARGV[3]: the highest fence this replica has seen (a flushed store must
--          not hand out a fence below one already in use)
-- Returns the fence held by this replica, or 0 when another holds the lease.
local holder = redis.call('GET', KEYS[1])
if holder then
  local id, fence = string.match(holder, '^(.*) (%d+)$')
  if id == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return tonumber(fence)
  end
  return 0
end
local fence = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[3])
if fence <= floor then
  fence = floor + 1
  redis.call('SET', KEYS[2], fence)
end
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. fence, 'PX', ARGV[2])
return fence

-- Writes the directive table if, and only if, the writer still holds the
-- lease under the fence it was granted: a leader that was paused past its
-- lease (and replaced) cannot overwrite its successor's table.
-- KEYS[1]: the lease; KEYS[2]: the directive table
-- ARGV[1]: "<replica id> <fence>" as granted; ARGV[2]: the encoded table
-- Returns 1 when written, 0 when fenced off.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2])
return 1

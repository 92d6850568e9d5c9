-- Sluice's exact quotas on Redis: decides the counted descriptors of one
-- ShouldRateLimit request (those of one cluster slot) in one call, with the
-- algorithms of control-plane/src/quotas/algorithm.rs step for step.
--
-- KEYS[i]   the counter of descriptor i:
--           fixed:   a string holding the latest window start reached (ms);
--                    the window's count is the string KEYS[i]:<start>,
--                    incremented as envoyproxy/ratelimit increments its
--                    per-window keys (INCRBY, refused hits included)
--           sliding: a hash, m = window start, c = current, p = previous
--           gcra:    a hash, m = theoretical arrival time (us)
--           Each key's hash tag is its descriptor, so a window's count
--           shares the slot of its key.
-- ARGV[1]   algorithm: "fixed", "sliding" or "gcra"
-- ARGV[2]   now in ms since the Unix epoch, or "" for the server's clock
-- ARGV[3]   "1": when a descriptor would go over its limit, count the hits
--           of the descriptors that would go over only
--           (envoyproxy/ratelimit's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT;
--           fixed windows only)
-- ARGV[3 + 5(i-1) + 1..5]   limit, window_ms, burst, hits, direction of
--           descriptor i; direction: "t" taken (counted when admitted; the
--           fixed window counts refused hits too), "c" charged (counted
--           whether admitted or not), "r" refunded (subtracted down to
--           zero, always admitted)
--
-- Returns one {admitted (0/1), remaining, reset_ms, used} per key; a
-- refused one has remaining 0 and reset_ms > 0. Numbers are written with
-- %d: Lua would print a 16-digit microsecond timestamp as 1.7e+15 and lose
-- it.

local algorithm = ARGV[1]
local now
if ARGV[2] == '' then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
else
  now = tonumber(ARGV[2])
end
local stop_increment = ARGV[3] == '1'

local function clamp(value)
  if value < 0 then return 0 end
  if value > 4294967295 then return 4294967295 end
  return value
end

-- The window a fixed counter counts in now: the latest one reached (a
-- clock that went back stays in it), and that window's count key.
local function fixed_window(key, window)
  local start = now - now % window
  local reached = tonumber(redis.call('GET', key)) or 0
  if start > reached then
    reached = start
    -- Kept as long as the window's count: one window past its end.
    redis.call('SET', key, string.format('%d', start), 'PX',
      string.format('%d', start + 2 * window - now))
  end
  return reached, key .. ':' .. string.format('%d', reached)
end

local function fixed(key, limit, window, hits, direction)
  local reached, count_key = fixed_window(key, window)
  local count
  if direction == 'r' then
    count = tonumber(redis.call('GET', count_key)) or 0
    local back = math.min(hits, count)
    if back > 0 then
      -- DECRBY keeps the key's expiry.
      count = redis.call('DECRBY', count_key, back)
    end
    return true, clamp(limit - count), math.max(reached + window - now, 1), count
  end
  if hits > 0 then
    count = redis.call('INCRBY', count_key, hits)
    if count == hits then
      redis.call('PEXPIRE', count_key, string.format('%d', reached + 2 * window - now))
    end
  else
    count = tonumber(redis.call('GET', count_key)) or 0
  end
  local reset = math.max(reached + window - now, 1)
  if count <= limit then
    return true, clamp(limit - count), reset, count
  end
  return false, 0, reset, count
end

local function sliding(s, limit, window, hits, direction)
  local start = now - now % window
  if start > s.m then
    local previous = 0
    if start - s.m == window then previous = s.c end
    s.m, s.c, s.p = start, 0, previous
  end
  local into = math.min(math.max(now - s.m, 0), window)
  local weight = (window - into) / window
  local estimate = s.p * weight + s.c
  local admitted
  if direction == 'r' then
    -- The current window's hits first, then the previous one's.
    local from_current = math.min(hits, s.c)
    s.c = s.c - from_current
    s.p = math.max(s.p - (hits - from_current), 0)
    admitted = true
  else
    admitted = estimate + hits <= limit
    if admitted or direction == 'c' then s.c = s.c + hits end
  end
  local used = s.p * weight + s.c
  local remaining = 0
  if admitted then remaining = clamp(math.floor(math.max(limit - used, 0))) end
  return admitted, remaining, math.max(s.m + window - now, 0), math.ceil(used)
end

local function gcra(s, limit, window, burst, hits, direction)
  local now_us = now * 1000
  if limit == 0 then return hits == 0 or direction == 'r', 0, window, 0 end
  local interval = math.max(math.floor(window * 1000 / limit), 1)
  burst = math.max(burst, 1)
  local tolerance = interval * (burst - 1)
  local spread = interval * hits
  local admitted, new_tat
  if direction == 'r' then
    s.m = math.max(s.m - spread, 0)
    admitted, new_tat = true, s.m
  else
    local tat = math.max(s.m, now_us)
    new_tat = tat + spread
    admitted = new_tat - now_us <= tolerance + interval
    if admitted or direction == 'c' then s.m = new_tat end
  end
  local ahead = math.max(s.m, now_us) - now_us
  local in_flight = math.ceil(ahead / interval)
  if not admitted then
    local wait
    if direction == 't' and hits > burst then
      wait = window * 1000
    else
      wait = math.max(new_tat - (now_us + tolerance + interval), 0)
    end
    return false, 0, math.max(math.ceil(wait / 1000), 1), in_flight
  end
  return true, clamp(burst - in_flight), math.ceil(ahead / 1000), in_flight
end

local function arg(i, n)
  return tonumber(ARGV[3 + (i - 1) * 5 + n])
end

local hits_of = {}
local direction_of = {}
for i = 1, #KEYS do
  hits_of[i] = arg(i, 4)
  direction_of[i] = ARGV[3 + (i - 1) * 5 + 5]
end

if stop_increment and algorithm == 'fixed' then
  -- Which descriptors these hits would take over their limit: if any,
  -- only those count them (a refund is never over, and always given).
  local over = {}
  local any_over = false
  for i, key in ipairs(KEYS) do
    over[i] = false
    if direction_of[i] ~= 'r' then
      local window = math.max(arg(i, 2), 1)
      local start = now - now % window
      local reached = math.max(tonumber(redis.call('GET', key)) or 0, start)
      local count = tonumber(redis.call('GET', key .. ':' .. string.format('%d', reached))) or 0
      over[i] = count + hits_of[i] > arg(i, 1)
    end
    any_over = any_over or over[i]
  end
  if any_over then
    for i = 1, #KEYS do
      if not over[i] and direction_of[i] ~= 'r' then hits_of[i] = 0 end
    end
  end
end

local results = {}
for i, key in ipairs(KEYS) do
  local limit = arg(i, 1)
  local window = math.max(arg(i, 2), 1)
  local burst = arg(i, 3)
  local hits = hits_of[i]
  local direction = direction_of[i]
  local admitted, remaining, reset, used
  if algorithm == 'fixed' then
    admitted, remaining, reset, used = fixed(key, limit, window, hits, direction)
  else
    local stored = redis.call('HMGET', key, 'm', 'c', 'p')
    local s = { m = tonumber(stored[1]) or 0, c = tonumber(stored[2]) or 0, p = tonumber(stored[3]) or 0 }
    if algorithm == 'sliding' then
      admitted, remaining, reset, used = sliding(s, limit, window, hits, direction)
    else
      admitted, remaining, reset, used = gcra(s, limit, window, burst, hits, direction)
    end
    redis.call('HSET', key, 'm', string.format('%d', s.m), 'c', string.format('%d', s.c),
      'p', string.format('%d', s.p))
    -- Two windows: the sliding window still reads the previous one, and a
    -- GCRA schedule runs at most one window ahead.
    redis.call('PEXPIRE', key, window * 2)
  end
  local flag = 0
  if admitted then flag = 1 end
  results[i] = { flag, remaining, reset, used }
end
return results

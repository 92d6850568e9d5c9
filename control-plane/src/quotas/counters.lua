-- Sluice's exact quotas on Redis: decides every counted descriptor of one
-- ShouldRateLimit request in one call, with the algorithms of
-- control-plane/src/quotas/algorithm.rs step for step.
--
-- KEYS[i]   the counter of descriptor i (a hash: m = mark, c = current,
--           p = previous, as algorithm.rs's State)
-- ARGV[1]   algorithm: "fixed", "sliding" or "gcra"
-- ARGV[2]   now in ms since the Unix epoch, or "" for the server's clock
-- ARGV[2 + 4(i-1) + 1..4]   limit, window_ms, burst, hits of descriptor i
--
-- Returns one {admitted (0/1), remaining, reset_ms, used} per key.
-- Numbers are written with %d: Lua would print a 16-digit microsecond
-- timestamp as 1.7e+15 and lose it.

local algorithm = ARGV[1]
local now
if ARGV[2] == '' then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
else
  now = tonumber(ARGV[2])
end

local function clamp(value)
  if value < 0 then return 0 end
  if value > 4294967295 then return 4294967295 end
  return value
end

local function fixed(s, limit, window, hits)
  local start = now - now % window
  -- A clock that went back stays in the window it had reached.
  if start > s.m then s.m, s.c, s.p = start, 0, 0 end
  -- As envoyproxy/ratelimit: the counter counts refused hits too.
  s.c = s.c + hits
  local admitted = s.c <= limit
  return admitted, clamp(limit - s.c), math.max(s.m + window - now, 0), s.c
end

local function sliding(s, limit, window, hits)
  local start = now - now % window
  if start > s.m then
    local previous = 0
    if start - s.m == window then previous = s.c end
    s.m, s.c, s.p = start, 0, previous
  end
  local into = math.min(math.max(now - s.m, 0), window)
  local weight = (window - into) / window
  local estimate = s.p * weight + s.c
  local admitted = estimate + hits <= limit
  if admitted then s.c = s.c + hits end
  local used = s.p * weight + s.c
  return admitted, clamp(math.floor(math.max(limit - used, 0))),
    math.max(s.m + window - now, 0), math.ceil(used)
end

local function gcra(s, limit, window, burst, hits)
  local now_us = now * 1000
  if limit == 0 then return false, 0, window, 0 end
  local interval = math.max(math.floor(window * 1000 / limit), 1)
  burst = math.max(burst, 1)
  local tolerance = interval * (burst - 1)
  local tat = math.max(s.m, now_us)
  local new_tat = tat + interval * hits
  local admitted = hits == 0 or new_tat - now_us <= tolerance + interval
  if admitted then s.m = new_tat end
  local ahead = math.max(s.m, now_us) - now_us
  local in_flight = math.ceil(ahead / interval)
  return admitted, clamp(burst - in_flight), math.ceil(ahead / 1000), in_flight
end

local results = {}
for i, key in ipairs(KEYS) do
  local base = 2 + (i - 1) * 4
  local limit = tonumber(ARGV[base + 1])
  local window = math.max(tonumber(ARGV[base + 2]), 1)
  local burst = tonumber(ARGV[base + 3])
  local hits = tonumber(ARGV[base + 4])
  local stored = redis.call('HMGET', key, 'm', 'c', 'p')
  local s = { m = tonumber(stored[1]) or 0, c = tonumber(stored[2]) or 0, p = tonumber(stored[3]) or 0 }
  local admitted, remaining, reset, used
  if algorithm == 'fixed' then
    admitted, remaining, reset, used = fixed(s, limit, window, hits)
  elseif algorithm == 'sliding' then
    admitted, remaining, reset, used = sliding(s, limit, window, hits)
  else
    admitted, remaining, reset, used = gcra(s, limit, window, burst, hits)
  end
  redis.call('HSET', key, 'm', string.format('%d', s.m), 'c', string.format('%d', s.c),
    'p', string.format('%d', s.p))
  -- Two windows: the sliding window still reads the previous one, and a
  -- GCRA schedule runs at most one window ahead.
  redis.call('PEXPIRE', key, window * 2)
  local flag = 0
  if admitted then flag = 1 end
  results[i] = { flag, remaining, reset, used }
end
return results

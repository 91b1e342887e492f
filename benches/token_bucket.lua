-- Token bucket as commonly deployed on Redis, run per request with EVALSHA.
-- KEYS[1]: bucket key
-- ARGV[1]: capacity (tokens), ARGV[2]: refill rate (tokens per second), ARGV[3]: cost
-- Returns { allowed (1/0), tokens left (floored) }.
-- The clock is read inside the script so every caller shares the server's time.
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local stored = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(stored[1])
local last = tonumber(stored[2])
if tokens == nil or last == nil then
  tokens = capacity
  last = now_ms
end

local elapsed = math.max(0, now_ms - last)
tokens = math.min(capacity, tokens + elapsed * rate / 1000)

local allowed = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
end

redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now_ms)
-- Keep the hash only as long as an empty bucket needs to refill completely.
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity / rate * 1000))
return { allowed, math.floor(tokens) }

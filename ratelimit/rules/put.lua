-- put.lua: make a rule-set body the next version if the expected version is current,
-- log it, and announce it (compare-and-set; the caller retries on conflict).
--
-- KEYS[1]  {rl:rules}:current   current version number
-- KEYS[2]  {rl:rules}:log       newest-first list of version records
-- KEYS[3]  {rl:rules}:v:<n>     body key of the new version n = ARGV[1] + 1
-- ARGV[1]  base version (the caller's view of current)
-- ARGV[2]  body (JSON, "version" already set to n)
-- ARGV[3]  version record (JSON)
-- ARGV[4]  pub/sub channel
-- ARGV[5]  number of log records kept
--
-- Returns {1, n} on success, {0, current version} on conflict.

local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if cur ~= tonumber(ARGV[1]) then
  return {0, cur}
end
local n = string.format('%d', cur + 1)
redis.call('SET', KEYS[3], ARGV[2])
redis.call('SET', KEYS[1], n)
redis.call('LPUSH', KEYS[2], ARGV[3])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[5]) - 1)
redis.call('PUBLISH', ARGV[4], n)
return {1, cur + 1}

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
-- ARGV[6]  the new version n (> ARGV[1]; rulestore.NextVersion)
--
-- Returns {1, n} on success, {0, current version} on conflict. The bodies of versions
-- whose records fall off the log are deleted (they can no longer be rolled back to);
-- their keys share the {rl:rules} tag, so they live on this node of a cluster.

local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if cur ~= tonumber(ARGV[1]) then
  return {0, cur}
end
local keep = tonumber(ARGV[5])
redis.call('SET', KEYS[3], ARGV[2])
redis.call('SET', KEYS[1], ARGV[6])
redis.call('LPUSH', KEYS[2], ARGV[3])
for _, rec in ipairs(redis.call('LRANGE', KEYS[2], keep, -1)) do
  local ok, r = pcall(cjson.decode, rec)
  if ok and type(r) == 'table' and type(r.version) == 'number' then
    redis.call('DEL', '{rl:rules}:v:' .. string.format('%d', r.version))
  end
end
redis.call('LTRIM', KEYS[2], 0, keep - 1)
redis.call('PUBLISH', ARGV[4], ARGV[6])
return {1, tonumber(ARGV[6])}

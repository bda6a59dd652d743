-- fleet.lua: records the gateways one service instance heard from in the fleet set and
-- answers the set's size (Reply.Nodes, which sizes cold-start allowances and first leases). Known
-- members are refreshed; a gateway not yet in the set joins only while the set is below
-- its cap and this second's joins are below the join rate, so node ids a client invents
-- can neither inflate the size at once nor beyond the cap.
--
-- KEYS[1]  fleet set: ZSET, member = node id, score = last sync (unix ms)
-- KEYS[2]  joins of the current second (counter; expires after two seconds)
-- ARGV[1]  now (unix ms)          ARGV[2] fleet window (ms): older members are dropped
-- ARGV[3]  cap (members at most)  ARGV[4] joins per second (every instance together)
-- ARGV[5]  n: the next n ids are members this instance admitted before (refreshed)
-- ARGV[6 .. 5+n]   those ids
-- ARGV[6+n ..]     candidates: ids past their probation, not admitted here yet
-- Returns {size, a_1, ..., a_m}: a_i is 1 when candidate i is now a member (already one,
-- through another instance, or joined now), else 0.
local now, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local cap, rate = tonumber(ARGV[3]), tonumber(ARGV[4])
local n = tonumber(ARGV[5])
local set, joins = KEYS[1], KEYS[2]

redis.call('ZREMRANGEBYSCORE', set, '-inf', '(' .. (now - window))
for i = 6, 5 + n do
  redis.call('ZADD', set, now, ARGV[i])
end
local size = redis.call('ZCARD', set)
local joined = tonumber(redis.call('GET', joins) or '0')
local out = {0}
for i = 6 + n, #ARGV do
  local id = ARGV[i]
  local ok = 0
  if redis.call('ZSCORE', set, id) then
    redis.call('ZADD', set, now, id)
    ok = 1
  elseif size < cap and joined < rate then
    redis.call('ZADD', set, now, id)
    size, joined, ok = size + 1, joined + 1, 1
  end
  out[#out + 1] = ok
end
if joined > 0 then
  redis.call('SET', joins, joined, 'PX', 2000)
end
redis.call('PEXPIRE', set, 2 * window)
out[1] = size
return out

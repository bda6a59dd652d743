-- lease.lua: apply one sync delta to one bucket and grant the node a lease
-- (RATIONALE.md §2 steps 1-7). The Go twin is shared/lease.Sync; the service tests check
-- that both compute the same outputs and store the same fields. The store prepends one
-- algorithm fragment (algo_*.lua: algo_available, algo_take, algo_refund, algo_decide,
-- algo_reset_at, algo_retry_after) so each algorithm gets its own script.
--
-- KEYS[1]  bucket hash   rl:{<caller key>}:<rule id>:<window index>
--          fields: st (algorithm state), p ("kind:limit:window_us:burst"),
--                  o:<node> outstanding lease, d:<node> demand (milli-permits/s),
--                  s:<node> last sync (µs), q:<node>:<worker> last applied seq,
--                  g:<node>:<worker> its grant (strict deltas: 1 allowed / 0 refused)
-- KEYS[2]  penalty hash  rl:{<caller key>}:penalty   fields: l level, u until µs, t last step µs
-- ARGV[1]  node            ARGV[2]  worker          ARGV[3]  seq (decimal uint64)
-- ARGV[4]  flags (bit 0 strict)
-- ARGV[5]  leased          ARGV[6]  over            ARGV[7]  returned
-- ARGV[8]  rejected        ARGV[9]  early
-- ARGV[10] algorithm kind  ARGV[11] limit           ARGV[12] window_us   ARGV[13] burst
-- ARGV[14] lease_ttl_us    ARGV[15] horizon_ms
-- ARGV[16] penalty_base_us ARGV[17] penalty_max_us
-- ARGV[18] now_us: TESTS ONLY, overrides TIME when non-empty (production sends none)
--
-- Returns {replay (0/1), allowed (0/1), remaining, grant, held, reset_in_us,
--          retry_in_us, penalty_in_us, penalty_level, now_us, overshoot, reclaimed}
--
-- All arithmetic is on integers below 2^53 (exact in doubles) and every number written
-- to Redis goes through istr: Redis would otherwise format large numbers in exponent form.

local bkey, pkey = KEYS[1], KEYS[2]
local node, worker, seq = ARGV[1], ARGV[2], ARGV[3]
local flags = tonumber(ARGV[4])
local leased, over, returned = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local rejected, early = tonumber(ARGV[8]), tonumber(ARGV[9])
local kind = ARGV[10]
local p = {limit = tonumber(ARGV[11]), window_us = tonumber(ARGV[12]), burst = tonumber(ARGV[13])}
local lease_ttl, horizon_ms = tonumber(ARGV[14]), tonumber(ARGV[15])
local pen_base, pen_max = tonumber(ARGV[16]), tonumber(ARGV[17])
local now
if ARGV[18] and ARGV[18] ~= '' then
  now = tonumber(ARGV[18])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local strict = flags % 2 == 1
local wsuffix = node .. ':' .. worker

local function istr(x)
  return string.format('%d', x)
end

-- floor(a/b) for integers 0 <= a < 2^53, b > 0: the double quotient can round up
-- across an integer, so correct it with the exact remainder.
local function idiv(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
  elseif r >= b then
    q = q + 1
  end
  return q
end

-- a > b for decimal strings without leading zeros (uint64 does not fit a double).
local function newer(a, b)
  if #a ~= #b then
    return #a > #b
  end
  return a > b
end

local function cooldown(level)
  if level <= 0 then
    return 0
  end
  local c, i = pen_base, 1
  while i < level and c < pen_max do
    c = c * 2
    i = i + 1
  end
  if c > pen_max then
    c = pen_max
  end
  return c
end

local function finish(replay, allowed, grant, held, st, refused, overshoot, reclaimed, plevel, puntil)
  local remaining = algo_available(p, st, now)
  local reset = algo_reset_at(p, st, now) - now
  if reset < 0 then
    reset = 0
  end
  local cost = 1
  if refused and over > 1 then
    cost = over
  end
  local retry = algo_retry_after(p, st, now, cost)
  if retry < 0 then
    retry = 0
  end
  local pen_us = puntil - now
  if pen_us < 0 then
    pen_us = 0
  end
  return {replay, allowed, remaining, grant, held, reset, retry, pen_us, plevel, now, overshoot, reclaimed}
end

local raw = redis.call('HGETALL', bkey)
local f = {}
for i = 1, #raw, 2 do
  f[raw[i]] = raw[i + 1]
end
local st = f['st'] or ''
if f['p'] and string.match(f['p'], '^(%d+):') ~= kind then
  st = '' -- another algorithm's encoding
end

local pen = redis.call('HMGET', pkey, 'l', 'u', 't')
local plevel, puntil, plast = tonumber(pen[1]) or 0, tonumber(pen[2]) or 0, tonumber(pen[3]) or 0

-- Replay of an applied batch: change nothing, answer with the original grant.
local q = f['q:' .. wsuffix]
if q and not newer(seq, q) then
  local g = tonumber(f['g:' .. wsuffix]) or 0
  local allowed, grant = 1, 0
  if strict then
    if g ~= 1 then
      allowed = 0
    end
  else
    grant = g
  end
  local rl, ru = plevel, puntil
  if rl > 0 and now - ru >= pen_max then
    rl, ru = 0, 0
  end
  return finish(1, allowed, grant, tonumber(f['o:' .. node]) or 0, st, strict and allowed == 0, 0, 0, rl, ru)
end

-- Nodes and their worker records.
local nodes, workers_of = {}, {}
for k, v in pairs(f) do
  if #k > 2 and string.sub(k, 2, 2) == ':' then
    local c, rest = string.sub(k, 1, 1), string.sub(k, 3)
    if c == 'o' or c == 'd' or c == 's' then
      local n = nodes[rest]
      if not n then
        n = {o = 0, d = 0, s = 0}
        nodes[rest] = n
      end
      n[c] = tonumber(v) or 0
    elseif c == 'q' or c == 'g' then
      local nm = string.match(rest, '^(.*):%d+$')
      if nm then
        local l = workers_of[nm]
        if not l then
          l = {}
          workers_of[nm] = l
        end
        l[#l + 1] = k
      end
    end
  end
end

-- 1-2. Reclaim expired leases (one refund of the sum, as the Go twin does).
local reclaimed, gone = 0, {}
for m, n in pairs(nodes) do
  if now - n.s > lease_ttl then
    reclaimed = reclaimed + n.o
    gone[#gone + 1] = 'o:' .. m
    gone[#gone + 1] = 'd:' .. m
    gone[#gone + 1] = 's:' .. m
    for _, k in ipairs(workers_of[m] or {}) do
      gone[#gone + 1] = k
    end
    nodes[m] = nil
  end
end
if reclaimed > 0 then
  st = algo_refund(p, st, now, reclaimed)
end

local nl = nodes[node]
local is_new = nl == nil
local o = 0
if nl then
  o = nl.o
end

-- Penalty: decay, then one step per pen_base for early requests.
local plevel0, puntil0, plast0 = plevel, puntil, plast
if plevel > 0 and now - puntil >= pen_max then
  plevel, puntil, plast = 0, 0, 0
end
if early > 0 and (plevel == 0 or now - plast >= pen_base) then
  if cooldown(plevel) < pen_max and plevel < 62 then
    plevel = plevel + 1
  end
  local u = now + cooldown(plevel)
  if u > puntil then
    puntil = u
  end
  plast = now
end
local penalized = puntil > now

-- 3. Consumption.
local covered = math.min(leased, o)
o = o - covered
local charge = leased - covered
if not strict then
  charge = charge + over
end
local overshoot = 0
if charge > 0 then
  local avail = algo_available(p, st, now)
  overshoot = charge - math.max(avail, 0)
  if overshoot < 0 then
    overshoot = 0
  end
  st = algo_take(p, st, now, charge)
end
local allowed = 1
if strict and over > 0 then
  if penalized then
    allowed = 0
  else
    local ok, nst = algo_decide(p, st, now, over)
    st = nst
    if not (ok == true or ok == 1) then
      allowed = 0
    end
  end
end

-- 4. Returned lease.
local ret = math.min(returned, o)
if ret > 0 then
  o = o - ret
  st = algo_refund(p, st, now, ret)
end

-- 5. Demand (milli-permits/s, EWMA with tau = min(horizon, 1 s)).
local count = leased + over + rejected
if count > 4194304 then
  count = 4194304
end
local d
if is_new then
  d = idiv(count * 1000000000, math.max(horizon_ms * 500, 1))
else
  local tau = math.min(horizon_ms * 1000, 1000000)
  local e = now - nl.s
  if e < 0 then
    e = 0
  elseif e > 60000000 then
    e = 60000000
  end
  d = idiv(nl.d * tau + count * 1000000000, tau + e)
end
if d > 2147483648 then
  d = 2147483648
end
nl = {o = o, d = d, s = now}
nodes[node] = nl

-- 6. Grant.
local grant = 0
if not strict and not penalized then
  local pool, sum = 0, 0
  for _, n in pairs(nodes) do
    pool = pool + n.o
    sum = sum + n.d
  end
  local avail = algo_available(p, st, now)
  pool = pool + avail
  local need = idiv(d * horizon_ms + 999999, 1000000)
  local share = 0
  if pool > 0 and sum > 0 then
    local dn, den = d, sum
    if den > 1048576 then
      local k = idiv(den + 1048575, 1048576)
      dn, den = idiv(dn, k), idiv(den, k)
    end
    share = idiv(math.min(pool, 4294967296) * dn, den)
  end
  local target = math.min(need, share)
  if d > 0 and pool >= 1 and target < 1 then
    target = 1
  end
  grant = math.min(math.max(target - o, 0), math.max(avail, 0), 4294967295 - o)
  if grant > 0 then
    st = algo_take(p, st, now, grant)
    o = o + grant
  else
    grant = 0
  end
end

-- Write back.
for i = 1, #gone, 256 do -- unpack has a stack limit: delete in slices
  redis.call('HDEL', bkey, unpack(gone, i, math.min(i + 255, #gone)))
end
local g = grant
if strict then
  g = allowed
end
redis.call('HSET', bkey,
  'p', kind .. ':' .. ARGV[11] .. ':' .. ARGV[12] .. ':' .. ARGV[13],
  'st', st,
  'o:' .. node, istr(o), 'd:' .. node, istr(d), 's:' .. node, istr(now),
  'q:' .. wsuffix, seq, 'g:' .. wsuffix, istr(g))
-- Keep the bucket until it is full again (and at least two windows and two lease TTLs).
local ttl = math.max(2 * p.window_us, algo_reset_at(p, st, now) - now + p.window_us, 2 * lease_ttl)
redis.call('PEXPIRE', bkey, idiv(ttl + 999, 1000))

if plevel ~= plevel0 or puntil ~= puntil0 or plast ~= plast0 then
  if plevel == 0 and puntil == 0 then
    redis.call('DEL', pkey)
  else
    redis.call('HSET', pkey, 'l', istr(plevel), 'u', istr(puntil), 't', istr(plast))
    redis.call('PEXPIRE', pkey, idiv(puntil - now + pen_max + 999, 1000) + 1000)
  end
end

return finish(0, allowed, grant, o, st, strict and allowed == 0, overshoot, reclaimed, plevel, puntil)

-- lease.lua: apply sync deltas of one batch to their buckets and grant the node leases
-- (RATIONALE.md §2 steps 1-7), one delta after the other. The Go twin is
-- shared/lease.Sync; the service tests check that both compute the same outputs and
-- store the same fields. The store prepends one algorithm fragment (algo_*.lua:
-- algo_available, algo_take, algo_refund, algo_decide, algo_reset_at,
-- algo_retry_after), so each algorithm has its own script and every delta of one call
-- uses that algorithm. A call carries many deltas (all keys in one slot on a cluster) so
-- the per-call cost of EVALSHA is paid once per group, not once per bucket.
--
-- KEYS[2i-1]  bucket hash of delta i   rl:{<caller key>}:<rule id>:<window index>
--             fields: st (algorithm state), p ("kind:limit:window_us:burst"),
--                     to, td (Σ o and Σ d over all nodes), sw (next expiry sweep, µs),
--                     o:<node> outstanding lease, d:<node> demand (milli-permits/s),
--                     s:<node> last sync (µs), q:<node>:<worker> last applied seq,
--                     g:<node>:<worker> its grant (strict deltas: 1 allowed / 0 refused)
-- KEYS[2i]    penalty hash of delta i  rl:{<caller key>}:penalty
--             fields: l level, u cooldown end (µs), t last step (µs)
-- ARGV[1] node   ARGV[2] worker   ARGV[3] seq (decimal uint64)
-- ARGV[4] lease_ttl_us   ARGV[5] horizon_ms   ARGV[6] penalty_base_us   ARGV[7] penalty_max_us
-- ARGV[8] now_us: TESTS ONLY, overrides TIME when non-empty (production sends '')
-- ARGV[9] algorithm kind (decimal, the fragment's)
-- ARGV[10+9(i-1) .. 18+9(i-1)] delta i: flags (bit 0 strict, bit 2 degraded), leased, over, returned,
--             rejected, early, limit, window_us, burst
--
-- Returns {now_us, then per delta i: replay (0/1), allowed (0/1), remaining, grant, held,
--          reset_in_us, retry_in_us, penalty_in_us, penalty_level, overshoot, reclaimed}
--
-- All arithmetic is on integers below 2^53 (exact in doubles) and every number written
-- to Redis goes through istr: Redis would otherwise format large numbers in exponent form.

local node, worker, seq = ARGV[1], ARGV[2], ARGV[3]
local lease_ttl, horizon_ms = tonumber(ARGV[4]), tonumber(ARGV[5])
local pen_base, pen_max = tonumber(ARGV[6]), tonumber(ARGV[7])
local kind = ARGV[9]
local now
if ARGV[8] ~= '' then
  now = tonumber(ARGV[8])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local wsuffix = node .. ':' .. worker
local qfield, gfield = 'q:' .. wsuffix, 'g:' .. wsuffix
local ofield, dfield, sfield = 'o:' .. node, 'd:' .. node, 's:' .. node

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

local out = {now}

-- Step 7: the reply fields derived from the state at now.
local function finish(p, st, over, replay, allowed, grant, held, refused, overshoot, reclaimed, plevel, puntil, reset_at, avail)
  if avail == nil then
    avail = algo_available(p, st, now)
  end
  if reset_at == nil then
    reset_at = algo_reset_at(p, st, now)
  end
  local reset = reset_at - now
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
  local n = #out
  out[n + 1], out[n + 2], out[n + 3], out[n + 4] = replay, allowed, avail, grant
  out[n + 5], out[n + 6], out[n + 7], out[n + 8] = held, reset, retry, pen_us
  out[n + 9], out[n + 10], out[n + 11] = plevel, overshoot, reclaimed
end

local function apply(bkey, pkey, a)
  local strict = tonumber(ARGV[a]) % 2 == 1
  local degraded = math.floor(tonumber(ARGV[a]) / 4) % 2 == 1
  local leased, over, returned = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local rejected, early = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  local p = {limit = tonumber(ARGV[a + 6]), window_us = tonumber(ARGV[a + 7]), burst = tonumber(ARGV[a + 8])}

  -- Read only what this delta needs: the totals, this node's fields and this worker's
  -- record. Every node's fields are read only when some lease may have expired.
  local hv = redis.call('HMGET', bkey, 'st', 'p', 'to', 'td', 'sw', ofield, dfield, sfield, qfield, gfield)
  local st = hv[1] or ''
  if hv[2] and string.match(hv[2], '^(%d+):') ~= kind then
    st = '' -- another algorithm's encoding
  end

  local pen = redis.call('HMGET', pkey, 'l', 'u', 't')
  local plevel, puntil, plast = tonumber(pen[1]) or 0, tonumber(pen[2]) or 0, tonumber(pen[3]) or 0

  -- Replay of an applied batch: change nothing, answer with the original grant.
  local q = hv[9]
  if q and not newer(seq, q) then
    local g = tonumber(hv[10]) or 0
    local allowed, grant = 1, 0
    if strict then
      if g ~= 1 then
        allowed = 0
      end
    else
      grant = g
    end
    if plevel > 0 and now - puntil >= pen_max then
      plevel, puntil = 0, 0
    end
    finish(p, st, over, 1, allowed, grant, tonumber(hv[6]) or 0, strict and allowed == 0, 0, 0, plevel, puntil)
    return
  end

  -- This node, and the totals over all nodes of o and d.
  local nl
  if hv[8] then
    nl = {o = tonumber(hv[6]) or 0, d = tonumber(hv[7]) or 0, s = tonumber(hv[8])}
  end
  local tot_o, tot_d = tonumber(hv[3]) or 0, tonumber(hv[4]) or 0

  -- 1-2. Reclaim expired leases. 'sw' is the earliest moment any lease can have expired
  -- (min s + ttl at the last sweep; later syncs only move s forward), so a sweep over all
  -- nodes runs only when one may have: it reclaims exactly what checking every node on
  -- every call would, and recomputes the totals. One refund of the sum, as the Go twin.
  local reclaimed, gone, swept, sweep_at = 0, {}, false, 0
  if now > (tonumber(hv[5]) or 0) then
    swept = true
    local raw = redis.call('HGETALL', bkey)
    local nodes, workers = {}, {}
    for i = 1, #raw, 2 do
      local k = raw[i]
      local c, colon = string.byte(k, 1, 2)
      if colon == 58 and #k > 2 then
        if c == 111 or c == 100 or c == 115 then -- o: d: s:
          local m = string.sub(k, 3)
          local n = nodes[m]
          if not n then
            n = {o = 0, d = 0, s = 0}
            nodes[m] = n
          end
          n[string.char(c)] = tonumber(raw[i + 1]) or 0
        elseif c == 113 or c == 103 then -- q: g:
          workers[#workers + 1] = k
        end
      end
    end
    local expired = {}
    tot_o, tot_d = 0, 0
    for m, n in pairs(nodes) do
      if now - n.s > lease_ttl then
        reclaimed = reclaimed + n.o
        gone[#gone + 1] = 'o:' .. m
        gone[#gone + 1] = 'd:' .. m
        gone[#gone + 1] = 's:' .. m
        expired[m] = true
        nodes[m] = nil
      else
        tot_o, tot_d = tot_o + n.o, tot_d + n.d
      end
    end
    for _, k in ipairs(workers) do
      local m = string.match(k, '^..(.*):%d+$')
      if m and expired[m] then
        gone[#gone + 1] = k
      end
    end
    nl = nodes[node]
    -- Next sweep: the earliest expiry among the nodes left, this one synced now.
    local first = now
    for m, n in pairs(nodes) do
      if m ~= node and n.s < first then
        first = n.s
      end
    end
    sweep_at = first + lease_ttl
  end
  if reclaimed > 0 then
    st = algo_refund(p, st, now, reclaimed)
  end

  local o, d_old = 0, 0
  if nl then
    o, d_old = nl.o, nl.d
  end
  local o_old = o

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

  -- 3. Consumption: what the lease covers was reserved already; the rest is charged
  -- unconditionally (debt is over-admission that really happened).
  local covered = math.min(leased, o)
  o = o - covered
  local charge = leased - covered
  if not strict then
    charge = charge + over
  end
  local overshoot = 0
  if charge > 0 then
    overshoot = charge - math.max(algo_available(p, st, now), 0)
    if overshoot < 0 then
      overshoot = 0
    end
    if degraded then
      charge = charge - overshoot -- forgive what the outage admitted beyond the bucket
    end
    if charge > 0 then
      st = algo_take(p, st, now, charge)
    end
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

  -- 4. Returned lease goes back to the pool.
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
  if nl == nil then
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
  tot_d = tot_d - d_old + d

  -- 6. Grant.
  local grant, avail = 0, nil
  if not strict and not penalized then
    local sum = tot_d
    avail = algo_available(p, st, now)
    local pool = tot_o - o_old + o + avail
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
      avail = nil
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
  tot_o = tot_o - o_old + o
  if swept then
    redis.call('HSET', bkey, 'sw', istr(sweep_at))
  end
  redis.call('HSET', bkey,
    'to', istr(tot_o), 'td', istr(tot_d),
    'p', kind .. ':' .. ARGV[a + 6] .. ':' .. ARGV[a + 7] .. ':' .. ARGV[a + 8],
    'st', st,
    ofield, istr(o), dfield, istr(d), sfield, istr(now),
    qfield, seq, gfield, istr(g))
  -- Keep the bucket until it is full again (and at least two windows and two lease TTLs).
  local reset_at = algo_reset_at(p, st, now)
  local ttl = math.max(2 * p.window_us, reset_at - now + p.window_us, 2 * lease_ttl)
  redis.call('PEXPIRE', bkey, idiv(ttl + 999, 1000))

  if plevel ~= plevel0 or puntil ~= puntil0 or plast ~= plast0 then
    if plevel == 0 and puntil == 0 then
      redis.call('DEL', pkey)
    else
      redis.call('HSET', pkey, 'l', istr(plevel), 'u', istr(puntil), 't', istr(plast))
      redis.call('PEXPIRE', pkey, idiv(puntil - now + pen_max + 999, 1000) + 1000)
    end
  end

  finish(p, st, over, 0, allowed, grant, o, strict and allowed == 0, overshoot, reclaimed, plevel, puntil, reset_at, avail)
end

for i = 1, #KEYS / 2 do
  apply(KEYS[2 * i - 1], KEYS[2 * i], 10 + 9 * (i - 1))
end
return out

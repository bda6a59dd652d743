-- lease.lua: apply the deltas of one batch (those of one Redis node, up to 100) to their
-- buckets and grant the gateway leases (RATIONALE.md §2), one delta after the other. The
-- Go twin is shared/lease.Sync; the store's differential test checks that both compute
-- the same outputs and store the same bytes. The store puts every algorithm fragment
-- (algo_*.lua) before this body, each in its own closure built on first use, as
-- ALGOS[kind] (see buildScript), so one script serves every algorithm.
--
-- KEYS[1] routes the call: with ARGV[1] set it is the gateway's idempotency hash on this
-- Redis node (tg:{<tag>}:q:<node>), whose field ARGV[1] holds "<seq>:<now>:<results>" of
-- the last call at that position of the gateway's batches. A call whose seq is not newer
-- is a replay: nothing is written and the results stored by the first call are answered
-- again (RATIONALE.md §2). Without ARGV[1], KEYS[1] is the first delta's bucket.
--
-- The bucket, penalty and node-lease keys come in ARGV, per delta, not in KEYS: on a Redis
-- Cluster the keys a command declares must share one slot, and one call carries the
-- deltas of every slot its node serves (the script's allow-cross-slot-keys flag lets it
-- touch them; Redis still refuses a key another node serves). The store computes every
-- name; the script builds none.
--   bucket   tg:{<caller key>}:<rule id>:<window index>[:<tier>]
--            a string: [0x21 uv epoch, cur, prev, demand_cur, demand_prev] then the
--            algorithm state; with rate leases out [0x22 and the same, then
--            rate_cur, rate_prev, acc_off, acc_frac] (Go lease.AppendValue)
--   node     tg:{<caller key>}|o:<node tag>:<rule id>:<window index>[:<tier>]
--            a string: the lease header alone, for one node's leases of the bucket, its
--            demand fields the permits its reports were charged in each epoch (Go
--            lease.NodeCap); 0x22 with its rate leases out: rate_cur, rate_prev;
--            acc_off, acc_frac 0
--   penalty  tg:{<caller key>}:p   hash: l level, u cooldown end (µs), t last step (µs;
--            at level 0 the last early claim), n tags of the nodes that claimed early;
--            o, ol, ou, ot one node's own cooldown (its tag, level, end, last step)
--
-- ARGV[1] idempotency field ('' for none)   ARGV[2] seq (decimal uint64)
-- ARGV[3] idempotency record TTL (ms)
-- ARGV[4] epoch_ms  ARGV[5] horizon_ms  ARGV[6] max_share  ARGV[7] renew_ms
-- ARGV[8] min_elapsed_ms  ARGV[9] valid_margin_ms  ARGV[10] penalty_base_us
-- ARGV[11] penalty_max_us
-- ARGV[12] now_us: TESTS ONLY, overrides TIME when non-empty (production sends '')
-- ARGV[13] nodes: the fleet size the service counts (0 or 1: no fleet)
-- ARGV[14+4(i-1) ..] delta i: bucket key, penalty key, the delta's numbers packed
--               little-endian as DELTA below (Go store.packDelta): kind u8, flags u8
--               (1 strict, 2 want, 4 degraded, 8 acquire, 128 no lease: set by the
--               service only), leased, over, returned, held, rejected, early, epoch,
--               elapsed_ms, limit (u32 each), window_us (double), burst, capacity, want,
--               rate, rate_used, rate_epoch, rate_stock (u32; flag 16: a gateway that
--               takes rate leases), node tag (u32: lease.NodeTag of the batch's node),
--               then the node-lease key. One string instead of twenty arguments: Redis
--               makes an object of every argument and the script a number of every
--               string, which cost more than the delta's arithmetic.
--
-- Returns {now_us, results}: results packs, per delta i, eighteen little-endian doubles
-- (RESULT below, Go store.parseResults): replay, allowed, remaining, grant, held, epoch,
-- valid_us, low_water, reset_in_us, retry_in_us, penalty_in_us, penalty_level,
-- overshoot, reclaimed, clamped, excess, rate, stock. Every value is an integer below 2^53, exact in
-- a double; one string instead of 18 integers per delta for the same reason.
--
-- All arithmetic is on integers below 2^53 (exact in doubles) and every number written
-- to Redis goes through istr: Redis would otherwise format large numbers in exponent form.

local dfield, seq, dttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local epoch_ms, horizon_ms, max_share = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local renew_ms, min_elapsed, margin_ms = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local pen_base, pen_max = tonumber(ARGV[10]), tonumber(ARGV[11])
local nodes = tonumber(ARGV[13])
local now
if ARGV[12] ~= '' then
  now = tonumber(ARGV[12])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local U32 = 4294967296
local RATE_LEASES = false
local DELTA = '<BBI4I4I4I4I4I4I4I4I4dI4I4I4I4I4I4I4I4'
local RESULT = '<dddddddddddddddddd'
-- the idempotency record's lease fields per delta: grant, held, epoch, valid_us, low,
-- rate, stock (records before rate leases: without the last two, SAVED5)
local SAVED = '<I4I4I4dI4I4I4'
local SAVED_LEN = 32
local SAVED5 = '<I4I4I4dI4'
local SAVED5_LEN = 24
local MAX_EPOCH_MS = 3600000
local P52 = 4503599627370496

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

-- signed maps a difference of two epoch indexes (mod 2^32) to [-2^31, 2^31) (Go int32).
local function signed(d)
  d = d % U32
  if d >= 2147483648 then
    d = d - U32
  end
  return d
end

-- header returns the record's header: 0x21 then the five values as uvarints (0x22 and
-- nine with rate leases), built in one byte array and one string.char (a string per
-- byte and a concat per value cost more Redis CPU than the bucket's arithmetic).
-- Division by 128 is exact in doubles.
local hbytes = {}
local function header(...)
  local n = 1
  local nv = select('#', ...)
  hbytes[1] = 0x21
  if nv == 9 then
    hbytes[1] = 0x22
  end
  for i = 1, nv do
    local x = select(i, ...)
    while x >= 128 do
      local q = math.floor(x / 128)
      n = n + 1
      hbytes[n] = x - q * 128 + 128
      x = q
    end
    n = n + 1
    hbytes[n] = x
  end
  return string.char(unpack(hbytes, 1, n))
end

-- read_uvarint returns the value at byte i of s and the index after it (nil if
-- malformed: truncated or longer than 8 bytes).
local function read_uvarint(s, i)
  local x, mul = 0, 1
  for k = 0, 7 do
    local b = string.byte(s, i + k)
    if b == nil then
      return nil
    end
    if b < 128 then
      return x + b * mul, i + k + 1
    end
    x = x + (b - 128) * mul
    mul = mul * 128
  end
  return nil
end

-- parse a bucket value: epoch, cur, prev, demand_cur, demand_prev, rate_cur,
-- rate_prev, acc_off, acc_frac, algorithm state (Go lease.ParseValue).
local function parse_value(v)
  local tag = v and string.byte(v, 1)
  if not v or #v == 0 or (tag ~= 0x21 and tag ~= 0x22) then
    return 0, 0, 0, 0, 0, 0, 0, 0, 0, v or ''
  end
  local vals, i = {0, 0, 0, 0, 0, 0, 0, 0, 0}, 2
  local nv = 5
  if tag == 0x22 then
    nv = 9
  end
  for n = 1, nv do
    local x, nx = read_uvarint(v, i)
    if not x or (n == 1 and x >= U32) or x > 1099511627776 then
      return 0, 0, 0, 0, 0, 0, 0, 0, 0, ''
    end
    vals[n], i = x, nx
  end
  return vals[1], vals[2], vals[3], vals[4], vals[5], vals[6], vals[7], vals[8], vals[9], string.sub(v, i)
end

-- rate_of is the bucket's refill in milli-permits per second for the rate leases (Go
-- lease.RateOf): token_bucket and gcra only, 0 where the arithmetic would not be exact.
local function rate_of(kind, limit, window_us, capacity)
  if (kind ~= 0 and kind ~= 1) or limit <= 0 or window_us < 1000 or window_us % 1000 ~= 0 then
    return 0
  end
  local r = idiv(limit * 1000000, window_us / 1000)
  if r < 1 or r >= U32 or r * math.max(capacity, 2 * MAX_EPOCH_MS) >= P52 then
    return 0
  end
  return r
end

-- ceil(a/b) for integers 0 <= a, a + b < 2^53, b > 0.
local function cdiv(a, b)
  return idiv(a + b - 1, b)
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

local NARG = 4

local function apply(a)
  local bkey, pkey = ARGV[a], ARGV[a + 1]
  local kind, flags, leased, over, returned, held_in, rejected, early, depoch, elapsed, limit, window_us, burst, capacity, want_in, drate, drate_used, drate_epoch, drate_stock, ntag =
    struct.unpack(DELTA, ARGV[a + 2])
  local A = ALGOS[kind]
  local strict_only = flags % 2 == 1
  local degraded = math.floor(flags / 4) % 2 == 1
  local acquire = math.floor(flags / 8) % 2 == 1
  local nolease = flags >= 128
  local rate_answer = math.floor(flags / 16) % 2 == 1
  local strict = strict_only or acquire
  local p = {limit = limit, window_us = window_us, burst = burst}
  local win = kind == 3 or kind == 4 or kind == 5

  local epoch, cur, prev, dcur, dprev, rcur, rprev, aoff, afrac, st = parse_value(redis.call('GET', bkey))
  local R = rate_of(kind, limit, window_us, capacity)
  -- cap_rates keeps the state at most C - ceil(C*sum/R) (Go capRates)
  local function cap_rates(s, sum)
    if sum <= 0 or R <= 0 then
      return s
    end
    sum = math.min(sum, R)
    local lim = capacity - cdiv(capacity * sum, R)
    local av = A.available(p, s, now)
    if av > lim then
      s = A.take(p, s, now, av - lim)
    end
    return s
  end

  -- 1. Epochs (Go epochClock, Leases.advance).
  local e = epoch_ms * 1000
  local k, j, estart, elen, valid_until
  if kind == 5 then
    -- a calendar period: epochs numbered as if every period were 31 days long (the
    -- longest), from the period's index (algo_common.lua)
    local per, off = algo__cal_norm(p.burst)
    local wi, ws, we = algo__cal_window(per, off, now)
    local n = idiv(algo__MAX_WINDOW + e - 1, e)
    j = idiv(now - ws, e)
    k = (wi * n + j) % U32
    estart, elen = ws + j * e, e
    valid_until = math.min(ws + (j + 2) * e, we)
  elseif not win or p.window_us <= 0 then
    local q = idiv(now, e)
    k, j, estart, elen, valid_until = q % U32, 0, q * e, e, (q + 2) * e
  else
    local w = p.window_us
    local wi = idiv(now, w)
    local ws = wi * w
    local el = math.min(e, w)
    local n = idiv(w + el - 1, el)
    j = idiv(now - ws, el)
    k = (wi * n + j) % U32
    estart, elen = ws + j * el, el
    valid_until = math.min(ws + (j + 2) * el, ws + w)
  end
  -- Epochs are indexes mod 2^32 compared as signed differences: a stored epoch ahead of
  -- now (the clock stepped back across an epoch boundary) has not ended and nothing
  -- moves; an empty record simply takes the current epoch.
  local reclaimed = 0
  local de = signed(k - epoch)
  local rempty = rcur == 0 and rprev == 0
  -- Rate leases accrued since the last call are charged first (Go Leases.accrue).
  local accrued, acc_ms, from_ms = 0, -1, 0
  local now_ms = cdiv(now, 1000)
  if not rempty then
    if R > 0 and not win then
      local s0 = (idiv(now, e) - de) * epoch_ms
      local at = s0 + aoff
      local x = afrac
      local e1 = math.min(now_ms, s0 + 2 * epoch_ms)
      if e1 > at then
        x = x + rcur * (e1 - at)
      end
      local e2 = math.min(now_ms, s0 + epoch_ms)
      if e2 > at then
        x = x + rprev * (e2 - at)
      end
      accrued = idiv(x, 1000000)
      afrac = x - accrued * 1000000
      acc_ms = math.max(at, now_ms)
      from_ms = at
    else
      rcur, rprev = 0, 0
      rempty = true
    end
  end
  local ahead = de < 0 and (cur ~= 0 or prev ~= 0 or dcur ~= 0 or dprev ~= 0 or not rempty)
  if ahead then
    -- nothing ended: the leases stay in their epoch, which the reply names
  elseif de == 1 and not (win and j == 0) then
    reclaimed = prev
    prev, cur = cur, 0
    dprev, dcur = dcur, 0
    rprev, rcur = rcur, 0
  elseif de ~= 0 then
    reclaimed = cur + prev
    cur, prev = 0, 0
    dcur, dprev = 0, 0
    rcur, rprev = 0, 0
  end
  if not ahead then
    epoch = k
  end
  if accrued > 0 then
    st = A.take(p, st, from_ms * 1000, accrued) -- when the accrual began (Go Sync)
  end
  st = cap_rates(st, rcur + rprev)
  -- which outstanding amount the delta's lease counts in (Go Leases.slot)
  local slot = nil
  if depoch ~= 0 then
    if depoch == epoch then
      slot = 'cur'
    elseif depoch == (epoch - 1) % U32 and not (win and j == 0) then
      slot = 'prev'
    end
  end
  local function slot_get()
    if slot == 'cur' then return cur elseif slot == 'prev' then return prev end
    return 0
  end
  local function slot_sub(x)
    if slot == 'cur' then cur = cur - x elseif slot == 'prev' then prev = prev - x end
  end
  -- The node's own record of its leases of this bucket (Go SyncNode's own): the same
  -- epochs and slots as the bucket's, for this node's leases alone (counts, and the
  -- rate leases it holds). A node renews only what it was granted, releases only the
  -- rate it was granted, and in a fleet its counts outstanding stay within
  -- capacity/max_share (its rate leases are not capped per node: RATIONALE.md §3).
  local okey = ARGV[a + 3]
  local oe, oc, op, ocd, opd, orc, orp = parse_value(redis.call('GET', okey))
  local oe0, oc0, op0, ocd0, opd0, orc0, orp0 = oe, oc, op, ocd, opd, orc, orp
  local od = signed(k - oe)
  if not (od < 0 and (oc ~= 0 or op ~= 0 or ocd ~= 0 or opd ~= 0 or orc ~= 0 or orp ~= 0)) then
    if od == 1 and not (win and j == 0) then
      op, oc = oc, 0
      opd, ocd = ocd, 0
      orp, orc = orc, 0
    elseif od ~= 0 then
      oc, op = 0, 0
      ocd, opd = 0, 0
      orc, orp = 0, 0
    end
    oe = k
  end
  local oslot = nil
  if depoch ~= 0 then
    if depoch == oe then
      oslot = 'cur'
    elseif depoch == (oe - 1) % U32 and not (win and j == 0) then
      oslot = 'prev'
    end
  end
  local function oget()
    if oslot == 'cur' then return oc elseif oslot == 'prev' then return op end
    return 0
  end
  local function osub(x)
    if oslot == 'cur' then oc = oc - x elseif oslot == 'prev' then op = op - x end
  end
  -- the node's other live epoch, in its record (oother) and in the bucket's (bother):
  -- what it reports is taken from where its own record counts it (Go SyncNode)
  local oother, bother = nil, nil
  if oslot then
    local e2 = (depoch + 1) % U32
    if oslot == 'cur' then
      e2 = (depoch - 1) % U32
    end
    if e2 ~= 0 then
      if e2 == oe then
        oother = 'cur'
      elseif e2 == (oe - 1) % U32 and not (win and j == 0) then
        oother = 'prev'
      end
      if e2 == epoch then
        bother = 'cur'
      elseif e2 == (epoch - 1) % U32 and not (win and j == 0) then
        bother = 'prev'
      end
    end
  end
  local function oother_get()
    if oother == 'cur' then return oc elseif oother == 'prev' then return op end
    return 0
  end
  local function oother_sub(x)
    if oother == 'cur' then oc = oc - x elseif oother == 'prev' then op = op - x end
  end
  local function otake(x) -- osub, then what is left of x from its other live epoch
    if oslot then
      local t = math.min(x, oget())
      osub(t)
      oother_sub(math.min(x - t, oother_get()))
    end
  end
  -- the rate slot of the delta's rate epoch (Go Leases.rateSlot), in the bucket's
  -- record and in the node's own
  local rslot = nil
  if drate_epoch ~= 0 then
    if drate_epoch == epoch then
      rslot = 'cur'
    elseif drate_epoch == (epoch - 1) % U32 and not (win and j == 0) then
      rslot = 'prev'
    end
  end
  local orslot = nil
  if drate_epoch ~= 0 then
    if drate_epoch == oe then
      orslot = 'cur'
    elseif drate_epoch == (oe - 1) % U32 and not (win and j == 0) then
      orslot = 'prev'
    end
  end

  -- 2. Consumption, charged now (Go Sync step 2).
  local avail0 = A.available(p, st, now) - (cur + prev)
  local covered = 0
  if slot then
    covered = math.min(leased, slot_get())
    slot_sub(covered)
  end
  otake(leased)
  local uncovered = leased - covered
  if (kind == 4 or kind == 5) and depoch ~= 0 and signed(k - depoch) > j then
    uncovered = 0 -- a lease of an earlier window: counted in that window
  end
  if not strict then
    uncovered = uncovered + over
  end
  local overshoot, clamped, excess = 0, 0, 0
  if uncovered > 0 then
    overshoot = uncovered - math.max(avail0, 0)
    if overshoot < 0 then
      overshoot = 0
    end
    if degraded then
      uncovered = uncovered - overshoot
    end
    -- No more than the rule could admit over the period the delta reports (Go
    -- ReportBound): the larger of limit and capacity per window of elapsed, rounded up
    -- and at most 2^20 windows, plus one capacity.
    local wus = math.max(p.window_us, 1)
    if kind == 5 then
      wus = algo__cal_shortest(p.burst) -- a month counts as 28 days
    end
    local nwin = math.min(idiv(elapsed * 1000 + wus - 1, wus), 1048576)
    local bound = math.max(p.limit, capacity) * (nwin + 1)
    if uncovered > bound then
      excess = uncovered - bound
      uncovered = bound
    end
    local limit = math.max(avail0 + capacity, 0)
    if uncovered > limit then
      clamped = uncovered - limit
      uncovered = limit
    end
  end
  local charged = covered + uncovered -- what this node's report is charged (Go NodeCap)
  if charged > 0 then
    st = A.take(p, st, now, charged)
  end
  -- 3. Penalty: decay, then one step per pen_base for early requests, counted only while
  -- the bucket is spent once this report's consumption is charged (Go Sync step 3).
  -- With a fleet (nodes > 1) a claim steps the level only while the level is below the
  -- number of distinct nodes that claimed early for the key (n, 8 hex digits each, at
  -- most 16), less one: one node's word alone, a forged report included, cannot
  -- penalize a key other nodes serve (Go Penalty.claim). Its claims step instead a
  -- cooldown of its own (o: its tag, ol, ou, ot: level, end, last step; one node at a
  -- time), which only the answers to it carry: a lone gateway still penalizes the
  -- callers that ignore its Retry-After, and harms only its own traffic.
  local pen = redis.call('HMGET', pkey, 'l', 'u', 't', 'n', 'o', 'ol', 'ou', 'ot')
  local plevel, puntil, plast = tonumber(pen[1]) or 0, tonumber(pen[2]) or 0, tonumber(pen[3]) or 0
  local pnodes = pen[4] or ''
  local powner, olevel, ountil, olast = pen[5] or '', tonumber(pen[6]) or 0, tonumber(pen[7]) or 0, tonumber(pen[8]) or 0
  local plevel0, puntil0, plast0, pnodes0 = plevel, puntil, plast, pnodes
  local powner0, olevel0, ountil0, olast0 = powner, olevel, ountil, olast
  if (plevel > 0 and now - puntil >= pen_max) or (plevel == 0 and pnodes ~= '' and now - plast >= pen_max) then
    plevel, puntil, plast, pnodes = 0, 0, 0, ''
  end
  if powner ~= '' and now - ountil >= pen_max then
    powner, olevel, ountil, olast = '', 0, 0, 0
  end
  local tag = string.format('%08x', ntag)
  if early > 0 and A.available(p, st, now) < 1 then
    local found = false
    for i = 1, #pnodes - 7, 8 do
      if string.sub(pnodes, i, i + 7) == tag then
        found = true
        break
      end
    end
    if not found and #pnodes < 128 then
      pnodes = pnodes .. tag
    end
    if plevel == 0 then
      plast = now
    end
    if (nodes <= 1 or plevel < #pnodes / 8 - 1) and (plevel == 0 or now - plast >= pen_base) then
      if cooldown(plevel) < pen_max and plevel < 62 then
        plevel = plevel + 1
      end
      local u = now + cooldown(plevel)
      if u > puntil then
        puntil = u
      end
      plast = now
    end
    if nodes > 1 and (powner == '' or powner == tag) and (olevel == 0 or now - olast >= pen_base) then
      powner = tag
      if cooldown(olevel) < pen_max and olevel < 62 then
        olevel = olevel + 1
      end
      local u = now + cooldown(olevel)
      if u > ountil then
        ountil = u
      end
      olast = now
    end
  end
  -- what this node's answer carries: the key's cooldown, and its own when it owns one
  local elevel, euntil = plevel, puntil
  if powner ~= '' and powner == tag then
    elevel, euntil = math.max(plevel, olevel), math.max(puntil, ountil)
  end
  local penalized = euntil > now
  local allowed = 1
  if strict and over > 0 then
    if penalized then
      allowed = 0
    else
      local eff = A.take(p, st, now, cur + prev)
      local ok = A.decide(p, eff, now, over)
      if ok == true or ok == 1 then
        st = A.take(p, st, now, over)
        charged = charged + over
      else
        allowed = 0
      end
    end
  end

  if nodes > 1 and not strict_only and not nolease then
    -- only where the cap can apply (Go SyncNode): a fleet, a delta that may be granted
    ocd = math.min(ocd + charged, 4294967296)
  end

  -- 4. Returned stops counting; held is renewed as far as the bucket backs it.
  local held = 0
  otake(returned)
  if slot then
    slot_sub(math.min(returned, slot_get()))
    held = math.min(held_in, slot_get(), oget()) -- no more than this node was granted
    slot_sub(held)
    osub(held)
    if oother and bother then
      -- the rest of what it holds from its other live epoch, as its record counts it
      local bget = prev
      if bother == 'cur' then
        bget = cur
      end
      local h2 = math.min(held_in - held, oother_get(), bget)
      oother_sub(h2)
      if bother == 'cur' then cur = cur - h2 else prev = prev - h2 end
      held = held + h2
    end
    local short = cur + prev + held - math.max(A.available(p, st, now), 0)
    if short > 0 then
      held = held - math.min(held, short)
    end
  end
  cur = cur + held
  oc = oc + held
  -- the rate the gateway held stops counting, as far as the node's own record says it
  -- was granted it (rclaim: a forged rate releases no other node's); its stock, within
  -- that rate's cap, is what the new rate keeps (Go SyncNode step 4)
  local keep, rclaim = 0, 0
  if rate_answer then
    if orslot == 'cur' then
      rclaim = math.min(drate, orc)
      orc = orc - rclaim
    elseif orslot == 'prev' then
      rclaim = math.min(drate, orp)
      orp = orp - rclaim
    end
    if rslot then
      local rheld
      if rslot == 'cur' then
        rheld = math.min(rclaim, rcur)
        rcur = rcur - rheld
      else
        rheld = math.min(rclaim, rprev)
        rprev = rprev - rheld
      end
      if R > 0 and rheld > 0 then
        keep = math.min(drate_stock, idiv(capacity * math.min(rheld, R), R))
      end
    end
  end

  -- 5. Demand (milli-permits per second): the gateway's over the reported interval, the
  -- bucket's over this epoch and the previous one.
  local count = leased + over + rejected
  if rate_answer then
    count = count + drate_used
  end
  if count > 4194304 then
    count = 4194304
  end
  local el = math.min(math.max(elapsed, min_elapsed), 60000)
  local rate = math.min(idiv(count * 1000000, el), 2147483648)
  dcur = math.min(dcur + count, 4294967296)
  local span_ms = math.max(idiv(now - estart + elen, 1000), 1)
  local total = math.min(idiv((dcur + dprev) * 1000000, span_ms), 2147483648)

  -- 6. Grant.
  local grant = 0
  local rgrant, rstock = 0, 0
  if not penalized and not strict_only and not nolease and (not acquire or allowed == 1) then
    local dn, den = math.min(rate, total), math.max(total, 1)
    if den > 1048576 then
      local f = idiv(den + 1048575, 1048576)
      dn, den = idiv(dn, f), math.max(idiv(den, f), 1)
    end
    local share = idiv(capacity * dn, den)
    local target = math.min(idiv(rate * horizon_ms + 999999, 1000000), share, idiv(capacity + max_share - 1, max_share))
    local first = -1 -- the cap of a first lease (Go FirstLeaseShare)
    if nodes > 1 and held == 0 and elapsed == 0 then -- never answered for this bucket
      first = idiv(capacity, 4 * nodes) -- FirstLeaseShare
      target = math.min(target, first)
    elseif nodes > 1 and dcur + dprev < capacity then
      -- a young bucket: demand below the capacity over two epochs (Go Sync)
      target = math.min(target, idiv(capacity + 4 * nodes - 1, 4 * nodes))
    end
    if rate > 0 and target < 1 and first ~= 0 then
      target = 1
    end
    local demand_target = target
    local want = 0
    if acquire then
      want = want_in
    end
    if want > 0 then
      target = held + want
    end
    local free = A.available(p, st, now) - (cur + prev)
    local avail = free
    if avail > 1 then
      avail = idiv(avail, 2)
    end
    if nodes > 1 then
      -- in a fleet, leases by demand leave capacity/2 unreserved (Go FleetLeaseKeep)
      avail = math.min(avail, capacity - idiv(capacity, 2) - (cur + prev))
    end
    avail = math.max(avail, math.min(want, free))
    local g = math.min(target - held, avail, 4294967295 - held)
    if nodes > 1 then
      -- what the node may hold (Go NodeCap): a lease's share, or what its reports were
      -- charged over its two epochs when that is more, up to the capacity
      local ncap = math.max(idiv(capacity + max_share - 1, max_share), math.min(ocd + opd, capacity))
      g = math.min(g, ncap - oc - op)
    end
    if g > 0 then
      grant = g
      cur = cur + g
      oc = oc + g
    end
    -- a rate lease (Go Sync step 6)
    -- (none while RATE_LEASES is off: Go SyncConfig.RateLeases says why)
    if RATE_LEASES and rate_answer and R > 0 and capacity > 0 and held + grant < demand_target and first < 0 and
      (nodes <= 1 or rate >= R or total * 100 >= R * 95) and (nodes <= 1 or dcur + dprev >= capacity) then
      local want_r = idiv(R * dn, den)
      if nodes <= 1 then
        want_r = R
      end
      local av = A.available(p, st, now)
      local room = idiv(math.max(capacity - (cur + prev) - math.max(-av - 1, 0), 0) * R, capacity) - (rcur + rprev)
      local avail_r = room
      local rheld = math.min(rclaim, room)
      if nodes > 1 and room > 1 then
        avail_r = math.max(rheld + idiv(room - rheld, 2), idiv(room, 2))
      end
      local gr = math.max(math.min(want_r, avail_r), math.min(cdiv(keep * R, capacity), math.max(room, 0)))
      local gcap = idiv(capacity * math.min(gr, R), R)
      if gr >= 1000 and gcap >= 1 then
        rgrant = gr
        rcur = rcur + gr
        orc = orc + gr
        keep = math.min(keep, gcap)
        st = cap_rates(st, rcur + rprev)
        rstock = math.min(keep + math.max(math.max(av, 0) - math.max(A.available(p, st, now), 0), 0), gcap)
      end
    end
  end
  if rcur == 0 and rprev == 0 then
    aoff, afrac = 0, 0
  else
    if acc_ms < now_ms then
      acc_ms = now_ms
    end
    aoff = math.max(acc_ms - (idiv(now, e) - signed(k - epoch)) * epoch_ms, 0)
  end
  local low = math.min(idiv(rate * renew_ms + 999999, 1000000), idiv(held + grant, 2))
  local valid = 0
  if held + grant > 0 or rgrant > 0 then
    local m = math.min(margin_ms * 1000, idiv(math.min(e, math.max(p.window_us, 1)), 10))
    valid = math.max(valid_until - now - m, 0)
  end

  -- Write back.
  local value = st
  if rcur ~= 0 or rprev ~= 0 then
    value = header(epoch, math.max(cur, 0), math.max(prev, 0), dcur, dprev, rcur, rprev, aoff, afrac) .. st
  elseif cur ~= 0 or prev ~= 0 or dcur ~= 0 or dprev ~= 0 then
    value = header(epoch, math.max(cur, 0), math.max(prev, 0), dcur, dprev) .. st
  end
  local eff = A.take(p, st, now, cur + prev)
  local reset_at = A.reset_at(p, eff, now)
  local ttl = math.max(2 * p.window_us, reset_at - now + p.window_us, 2 * e)
  if kind == 5 then
    -- a calendar period's key ends with the period (plus two epochs, Go TTLUs)
    ttl = reset_at - now + 2 * e
  end
  redis.call('SET', bkey, value, 'PX', idiv(ttl + 999, 1000))
  if oe ~= oe0 or oc ~= oc0 or op ~= op0 or ocd ~= ocd0 or opd ~= opd0 or orc ~= orc0 or orp ~= orp0 then
    if oc == 0 and op == 0 and ocd == 0 and opd == 0 and orc == 0 and orp == 0 then
      if oc0 ~= 0 or op0 ~= 0 or ocd0 ~= 0 or opd0 ~= 0 or orc0 ~= 0 or orp0 ~= 0 then
        redis.call('DEL', okey)
      end
    elseif orc == 0 and orp == 0 then
      -- three epochs: past the reclaim of everything it counts
      redis.call('SET', okey, header(oe, oc, op, ocd, opd), 'PX', 3 * epoch_ms)
    else
      redis.call('SET', okey, header(oe, oc, op, ocd, opd, orc, orp, 0, 0), 'PX', 3 * epoch_ms)
    end
  end

  if plevel ~= plevel0 or puntil ~= puntil0 or plast ~= plast0 or pnodes ~= pnodes0 or
    powner ~= powner0 or olevel ~= olevel0 or ountil ~= ountil0 or olast ~= olast0 then
    if plevel == 0 and puntil == 0 and pnodes == '' and powner == '' then
      redis.call('DEL', pkey)
    else
      redis.call('HSET', pkey, 'l', istr(plevel), 'u', istr(puntil), 't', istr(plast))
      if pnodes ~= '' then
        redis.call('HSET', pkey, 'n', pnodes)
      elseif pnodes0 ~= '' then
        redis.call('HDEL', pkey, 'n')
      end
      if powner ~= '' then
        redis.call('HSET', pkey, 'o', powner, 'ol', istr(olevel), 'ou', istr(ountil), 'ot', istr(olast))
      elseif powner0 ~= '' then
        redis.call('HDEL', pkey, 'o', 'ol', 'ou', 'ot')
      end
      -- at level 0 a record of claimants lives from its last claim (plast)
      redis.call('PEXPIRE', pkey, idiv(math.max(puntil, plast, ountil) - now + pen_max + 999, 1000) + 1000)
    end
  end

  -- 7. Reply (Go finish): every lease counted as taken, except in the reset (the
  -- charged state's: outstanding leases taken at now would push it later on every call
  -- and bring it back when they are returned, with nothing consumed).
  local remaining = A.available(p, eff, now)
  local reset = A.reset_at(p, st, now) - now
  if reset < 0 then
    reset = 0
  end
  local cost = 1
  if strict and allowed == 0 and over > 1 then
    cost = over
  end
  local retry = A.retry_after(p, eff, now, cost)
  if retry < 0 then
    retry = 0
  end
  local pen_us = euntil - now
  if pen_us < 0 then
    pen_us = 0
  end
  return struct.pack(RESULT, 0, allowed, remaining, grant, held, epoch, valid, low, reset, retry, pen_us, elevel, overshoot, reclaimed, clamped, excess, rgrant, rstock),
    struct.pack(SAVED, grant, held, epoch, valid, low, rgrant, rstock)
end

-- The idempotency record is "<seq>|<now>|" and SAVED per delta (binary). Records
-- written before rate leases, "<seq>;<now>;" and SAVED5 per delta, and before the
-- fields were packed, "<seq>:<now>:<fields, comma-separated>", are still read, so a
-- replay across an upgrade answers what was granted.
local n = (#ARGV - 13) / NARG
if dfield ~= '' then
  local rec = redis.call('HGET', KEYS[1], dfield)
  if rec then
    local s1 = string.find(rec, '[:;|]')
    local rseq = string.sub(rec, 1, s1 - 1)
    if not newer(seq, rseq) then
      -- Replay: answer what the first call granted, at its time, with the current
      -- state of nothing else (a replayed reply only hands over a lost grant).
      local sep = string.sub(rec, s1, s1)
      local s2 = string.find(rec, sep, s1 + 1, true)
      local t0 = tonumber(string.sub(rec, s1 + 1, s2 - 1))
      local vals = {}
      if sep == ':' then
        local k = 0
        for x in string.gmatch(string.sub(rec, s2 + 1), '[^,]+') do
          k = k + 1
          vals[math.floor((k - 1) / 5) * 7 + (k - 1) % 5 + 1] = tonumber(x)
        end
      else
        local fmt, len = SAVED, SAVED_LEN
        if sep == ';' then
          fmt, len = SAVED5, SAVED5_LEN
        end
        for i = 1, n do
          local at = s2 + 1 + (i - 1) * len
          if at + len - 1 <= #rec then
            local g, h, e, v, l, r, k = struct.unpack(fmt, rec, at)
            if sep == ';' then
              r, k = 0, 0
            end
            local b = (i - 1) * 7
            vals[b + 1], vals[b + 2], vals[b + 3], vals[b + 4], vals[b + 5], vals[b + 6], vals[b + 7] = g, h, e, v, l, r, k
          end
        end
      end
      local res = {}
      for i = 1, n do
        local g, h, e, v, l, r, k = 0, 0, 0, 0, 0, 0, 0
        if rseq == seq then
          local b = (i - 1) * 7
          g, h, e, v, l = vals[b + 1] or 0, vals[b + 2] or 0, vals[b + 3] or 0, vals[b + 4] or 0, vals[b + 5] or 0
          r, k = vals[b + 6] or 0, vals[b + 7] or 0
        end
        res[i] = struct.pack(RESULT, 1, 1, 0, g, h, e, v, l, 0, 0, 0, 0, 0, 0, 0, 0, r, k)
      end
      return {t0, table.concat(res)}
    end
  end
end

local res, saved = {}, {}
for i = 1, n do
  res[i], saved[i] = apply(14 + NARG * (i - 1))
end
if dfield ~= '' then
  redis.call('HSET', KEYS[1], dfield, seq .. '|' .. istr(now) .. '|' .. table.concat(saved))
  redis.call('PEXPIRE', KEYS[1], dttl)
end
return {now, table.concat(res)}

-- bucket.lua: the token-bucket/GCRA math of shared/algo/bucket.go, included by
-- algo_token_bucket.lua and algo_gcra.lua (the store expands "-- include:" lines). The
-- two algorithms share it exactly as in Go; only the state tag algo__TAG, which the
-- including fragment defines first, differs.
local algo__BUCKET = true

-- algo__norm clamps p exactly as Go's Params.norm: limit, window, capacity. One delta
-- calls it a dozen times with the same p, so the result is kept in p (the callers build
-- p once per delta and never change it).
local function algo__norm(p)
  if p.norm_l then return p.norm_l, p.norm_w, p.norm_c end
  local l = algo__clamp(math.floor(tonumber(p.limit) or 0), 1, algo__MAX_LIMIT)
  local w = algo__clamp(math.floor(tonumber(p.window_us) or 0), algo__MIN_WINDOW, algo__MAX_WINDOW)
  if w < l then w = l end
  local c = l
  if algo__BUCKET then
    local b = math.floor(tonumber(p.burst) or 0)
    if b > 0 then c = math.min(b, algo__MAX_BURST) end
    local m = algo__muldivrem(algo__MAX_REFILL, l, w)
    if c > m then c = m end
  end
  p.norm_l, p.norm_w, p.norm_c = l, w, c
  return l, w, c
end

-- algo__load decodes st and brings it to now (Go tatLoad): tat, frac with the time
-- tat + frac/l µs. A malformed state is fresh.
local function algo__load_raw(l, st, now)
  local tat, frac = now, 0
  if #st == 13 and string.byte(st, 1) == algo__TAG then
    local _, t, f = struct.unpack('<Bi8I4', st)
    if t > -algo__EXACT and t < algo__EXACT then
      local carry = math.floor(f / l)
      tat, frac = t + carry, f - carry * l
    end
  end
  if tat < now then return now, 0 end
  if tat - now >= algo__MAX_AHEAD then return now + algo__MAX_AHEAD, 0 end
  return tat, frac
end

local algo__ld_st, algo__ld_l, algo__ld_now, algo__ld_tat, algo__ld_frac
local function algo__load(l, st, now)
  -- one delta loads the same state several times: the last answer is kept (strings
  -- are interned, so the comparison is by reference)
  if st == algo__ld_st and l == algo__ld_l and now == algo__ld_now then
    return algo__ld_tat, algo__ld_frac
  end
  algo__ld_st, algo__ld_l, algo__ld_now = st, l, now
  algo__ld_tat, algo__ld_frac = algo__load_raw(l, st, now)
  return algo__ld_tat, algo__ld_frac
end

local function algo__encode(tat, frac)
  return struct.pack('<Bi8I4', algo__TAG, tat, frac)
end

-- permits out of the bucket: ceil((tat + frac/l - now) * l / w)
local function algo__used(l, w, tat, frac, now)
  local q, r = algo__muldivrem(tat - now, l, w)
  return q + math.floor((r + frac + w - 1) / w)
end

-- the most permits the state can be ahead by; a pure function of (l, w) needing the
-- long division, kept for the last pair (one delta asks for it several times)
local algo__mn_l, algo__mn_w, algo__mn = 0, 0, 0
local function algo__max_n(l, w)
  if l ~= algo__mn_l or w ~= algo__mn_w then
    algo__mn_l, algo__mn_w, algo__mn = l, w, algo__muldivrem(algo__MAX_AHEAD, l, w) + 1
  end
  return algo__mn
end

local function algo__add(l, w, tat, frac, now, k)
  local q, r = algo__muldivrem(math.min(k, algo__max_n(l, w)), w, l)
  frac = frac + r
  if frac >= l then
    frac = frac - l
    q = q + 1
  end
  tat = tat + q
  if tat - now >= algo__MAX_AHEAD then return now + algo__MAX_AHEAD, 0 end
  return tat, frac
end

local function algo__reset(tat, frac)
  if frac > 0 then return tat + 1 end
  return tat
end

local function algo__retry(l, w, c, tat, frac, now, cost)
  local m = c - cost
  local at
  if m >= 0 then
    local q, r = algo__muldivrem(m, w, l)
    at = tat - q
    if frac > r then at = at + 1 end
  else
    local q, r = algo__muldivrem(math.min(-m, algo__max_n(l, w)), w, l)
    at = tat + q + math.floor((frac + r + l - 1) / l)
  end
  return math.max(at - now, 0)
end

local function algo_available(p, st, now)
  local l, w, c = algo__norm(p)
  local tat, frac = algo__load(l, st or '', now)
  return c - algo__used(l, w, tat, frac, now)
end

local function algo_take(p, st, now, n)
  local l, w = algo__norm(p)
  local tat, frac = algo__load(l, st or '', now)
  return algo__encode(algo__add(l, w, tat, frac, now, math.max(n, 0)))
end

local function algo_refund(p, st, now, n)
  local l, w = algo__norm(p)
  local tat, frac = algo__load(l, st or '', now)
  local q, r = algo__muldivrem(math.min(math.max(n, 0), algo__max_n(l, w)), w, l)
  frac = frac - r
  if frac < 0 then
    frac = frac + l
    q = q + 1
  end
  tat = tat - q
  if tat < now then tat, frac = now, 0 end
  return algo__encode(tat, frac)
end

local function algo_reset_at(p, st, now)
  local l = algo__norm(p)
  return algo__reset(algo__load(l, st or '', now))
end

local function algo_retry_after(p, st, now, cost)
  local l, w, c = algo__norm(p)
  local tat, frac = algo__load(l, st or '', now)
  return algo__retry(l, w, c, tat, frac, now, math.max(cost, 0))
end

local function algo_decide(p, st, now, cost)
  st = st or ''
  cost = math.max(cost, 0)
  local l, w, c = algo__norm(p)
  local tat, frac = algo__load(l, st, now)
  local avail = c - algo__used(l, w, tat, frac, now)
  if cost > avail then
    return 0, st, math.max(avail, 0), algo__reset(tat, frac), algo__retry(l, w, c, tat, frac, now, cost)
  end
  tat, frac = algo__add(l, w, tat, frac, now, cost)
  return 1, algo__encode(tat, frac), avail - cost, algo__reset(tat, frac), 0
end

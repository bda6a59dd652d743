-- algo_sliding_window_counter.lua: the sliding window counter of shared/algo (Kind
-- sliding_window_counter), the same integer math on the same 17-byte state
-- (shared/algo/ENCODING.md), for the sync service's per-algorithm script. A fragment: it
-- defines local functions only and is concatenated before the lease preamble (see
-- README.md in this directory).
--
-- The estimate of the permits in the last window is curr + ceil(prev * (w - e) / w),
-- e = now - start of the current (aligned) window; its error bound is documented on
-- swcState in shared/algo/window.go.
--
-- p is {limit=, window_us=, burst=} (burst ignored), st the binary state ('' = fresh),
-- times in µs.
--   algo_available(p, st, now)          -> permits that could be taken now (< 0 in debt)
--   algo_take(p, st, now, n)            -> st   (consume n unconditionally, may go into debt)
--   algo_refund(p, st, now, n)          -> st   (give n back, current window first)
--   algo_decide(p, st, now, cost)       -> allowed (0/1), st, remaining, reset_us, retry_us
--   algo_reset_at(p, st, now)           -> absolute µs when the estimate is back to 0
--   algo_retry_after(p, st, now, cost)  -> µs until cost fits (0: now)
-- Every value stays an exact integer below 2^53; products that would not go through
-- algo__muldivrem.

local algo__TAG = 0x13
-- include: window.lua

-- algo__load: start, curr, prev, moved (whether they differ from st).
local function algo__load(w, st, now)
  local cur = math.floor(now / w) * w
  local s = algo__start(w, st, 17, cur)
  if not s then return cur, 0, 0, true end
  local _, _, curr, prev = struct.unpack('<Bi8I4I4', st)
  if s >= cur then return s, curr, prev, false end
  if s + w == cur then return cur, 0, curr, true end
  return cur, 0, 0, true
end

local function algo__encode(start, curr, prev)
  return struct.pack('<Bi8I4I4', algo__TAG, start, curr, prev)
end

-- ceil(prev * (w - e) / w): the previous window's share of the estimate
local function algo__weighted(w, start, prev, now)
  local e = algo__clamp(now - start, 0, w)
  local q, r = algo__muldivrem(prev, w - e, w)
  if r > 0 then q = q + 1 end
  return q
end

local function algo__reset(w, start, curr, prev, now)
  if curr > 0 then return start + 2 * w end
  if prev > 0 then return start + w end
  return now
end

local function algo__retry(l, w, start, curr, prev, now, cost)
  if cost <= l - curr - algo__weighted(w, start, prev, now) then return 0 end
  if cost > l then return math.max(algo__reset(w, start, curr, prev, now) - now, w) end
  local m = l - curr - cost
  if m >= 0 then
    return start + w - algo__muldivrem(m, w, prev) - now
  end
  local nxt = start + w
  m = l - cost
  if m >= curr then return nxt - now end
  return nxt + w - algo__muldivrem(m, w, curr) - now
end

local function algo_available(p, st, now)
  local l, w = algo__norm(p)
  local start, curr, prev = algo__load(w, st or '', now)
  return l - curr - algo__weighted(w, start, prev, now)
end

local function algo_take(p, st, now, n)
  local _, w = algo__norm(p)
  local start, curr, prev = algo__load(w, st or '', now)
  curr = math.min(curr + math.min(math.max(n, 0), algo__MAX_COUNT), algo__MAX_COUNT)
  return algo__encode(start, curr, prev)
end

local function algo_refund(p, st, now, n)
  local _, w = algo__norm(p)
  local start, curr, prev = algo__load(w, st or '', now)
  n = math.min(math.max(n, 0), algo__MAX_COUNT)
  local r = math.min(n, curr)
  curr = curr - r
  prev = math.max(prev - (n - r), 0)
  return algo__encode(start, curr, prev)
end

local function algo_reset_at(p, st, now)
  local _, w = algo__norm(p)
  local start, curr, prev = algo__load(w, st or '', now)
  return algo__reset(w, start, curr, prev, now)
end

local function algo_retry_after(p, st, now, cost)
  local l, w = algo__norm(p)
  local start, curr, prev = algo__load(w, st or '', now)
  return algo__retry(l, w, start, curr, prev, now, math.max(cost, 0))
end

local function algo_decide(p, st, now, cost)
  st = st or ''
  cost = math.max(cost, 0)
  local l, w = algo__norm(p)
  local start, curr, prev, moved = algo__load(w, st, now)
  local avail = l - curr - algo__weighted(w, start, prev, now)
  if cost > avail then
    if moved then st = algo__encode(start, curr, prev) end
    return 0, st, math.max(avail, 0), algo__reset(w, start, curr, prev, now),
      algo__retry(l, w, start, curr, prev, now, cost)
  end
  curr = curr + cost
  return 1, algo__encode(start, curr, prev), avail - cost, algo__reset(w, start, curr, prev, now), 0
end

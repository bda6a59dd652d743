-- algo_fixed_window.lua: the fixed window of shared/algo (Kind fixed_window), the same
-- integer math on the same 13-byte state (shared/algo/ENCODING.md), for the sync
-- service's per-algorithm script. A fragment: it defines local functions only and is
-- concatenated before the lease preamble (see README.md in this directory).
--
-- p is {limit=, window_us=, burst=} (burst ignored), st the binary state ('' = fresh),
-- times in µs. Windows are aligned to multiples of window_us since the clock's epoch.
--   algo_available(p, st, now)          -> permits that could be taken now (< 0 in debt)
--   algo_take(p, st, now, n)            -> st   (consume n unconditionally, may go into debt)
--   algo_refund(p, st, now, n)          -> st   (give n back, never above full)
--   algo_decide(p, st, now, cost)       -> allowed (0/1), st, remaining, reset_us, retry_us
--   algo_reset_at(p, st, now)           -> absolute µs of the end of the current window
--   algo_retry_after(p, st, now, cost)  -> µs until cost fits (0: now)
-- Every value stays an exact integer below 2^53.

local algo__TAG = 0x14
-- include: window.lua

-- algo__load: start, count, moved (whether they differ from st).
local function algo__load(w, st, now)
  local cur = math.floor(now / w) * w
  local s = algo__start(w, st, 13, cur)
  if not s or s < cur then return cur, 0, true end
  local _, _, c = struct.unpack('<Bi8I4', st)
  return s, c, false
end

local function algo__encode(start, count)
  return struct.pack('<Bi8I4', algo__TAG, start, count)
end

local function algo__retry(l, w, start, count, now, cost)
  local e = start + w
  if cost <= l - count then return 0 end
  if cost <= l then return e - now end
  return math.max(e - now, w)
end

local function algo_available(p, st, now)
  local l, w = algo__norm(p)
  local _, count = algo__load(w, st or '', now)
  return l - count
end

local function algo_take(p, st, now, n)
  local _, w = algo__norm(p)
  local start, count = algo__load(w, st or '', now)
  count = math.min(count + math.min(math.max(n, 0), algo__MAX_COUNT), algo__MAX_COUNT)
  return algo__encode(start, count)
end

local function algo_refund(p, st, now, n)
  local _, w = algo__norm(p)
  local start, count = algo__load(w, st or '', now)
  count = math.max(count - math.min(math.max(n, 0), algo__MAX_COUNT), 0)
  return algo__encode(start, count)
end

local function algo_reset_at(p, st, now)
  local _, w = algo__norm(p)
  local start = algo__load(w, st or '', now)
  return start + w
end

local function algo_retry_after(p, st, now, cost)
  local l, w = algo__norm(p)
  local start, count = algo__load(w, st or '', now)
  return algo__retry(l, w, start, count, now, math.max(cost, 0))
end

local function algo_decide(p, st, now, cost)
  st = st or ''
  cost = math.max(cost, 0)
  local l, w = algo__norm(p)
  local start, count, moved = algo__load(w, st, now)
  local avail = l - count
  if cost > avail then
    if moved then st = algo__encode(start, count) end
    return 0, st, math.max(avail, 0), start + w, algo__retry(l, w, start, count, now, cost)
  end
  return 1, algo__encode(start, count + cost), avail - cost, start + w, 0
end

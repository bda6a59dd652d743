-- algo_calendar.lua: the calendar window of shared/algo (Kind calendar): a fixed window
-- whose boundaries are calendar days, ISO weeks (Monday 00:00) or months at a fixed UTC
-- offset, the same integer math on the same 13-byte state as fixed_window with tag 0x15
-- (shared/algo/ENCODING.md), for the sync service's per-algorithm script. A fragment: it
-- defines local functions only and is concatenated before the lease preamble (see
-- README.md in this directory). The period arithmetic (algo__cal_*) is in
-- algo_common.lua, where the lease body uses it too.
--
-- p is {limit=, window_us=, burst=}: burst encodes period and offset
-- (period*10000 + offset_minutes + 1440), window_us is ignored (the period's own length
-- counts). st the binary state ('' = fresh), times in µs.
--   algo_available(p, st, now)          -> permits that could be taken now (< 0 in debt)
--   algo_take(p, st, now, n)            -> st   (consume n unconditionally, may go into debt)
--   algo_refund(p, st, now, n)          -> st   (give n back, never above full)
--   algo_decide(p, st, now, cost)       -> allowed (0/1), st, remaining, reset_us, retry_us
--   algo_reset_at(p, st, now)           -> absolute µs of the next period boundary
--   algo_retry_after(p, st, now, cost)  -> µs until cost fits (0: now)
-- Every value stays an exact integer below 2^53.

local algo__TAG = 0x15

-- algo__norm clamps p exactly as Go's Params.norm: limit, window (the period's longest
-- length), capacity (the limit), period, offset.
local function algo__norm(p)
  local l = algo__clamp(math.floor(tonumber(p.limit) or 0), 1, algo__MAX_LIMIT)
  local per, off = algo__cal_norm(p.burst)
  local w = algo__DAY
  if per == 2 then w = 7 * algo__DAY elseif per == 3 then w = 31 * algo__DAY end
  return l, w, l, per, off
end

-- algo__load (Go calLoad): start, end, count, moved (whether they differ from st). A
-- start that is not a period start or lies beyond the current period's end is fresh.
local function algo__load(per, off, st, now)
  local _, cur, e = algo__cal_window(per, off, now)
  if #st == 13 and string.byte(st, 1) == algo__TAG then
    -- the only period starts in [cur, e] are cur and e (the next period); a start at
    -- or beyond 2^53 unpacks rounded and must not match
    local _, s, c = struct.unpack('<Bi8I4', st)
    if s > -algo__EXACT and s < algo__EXACT then
      if s == cur then return s, e, c, false end
      if s == e then
        local _, _, next = algo__cal_window(per, off, e)
        return s, next, c, false
      end
    end
  end
  return cur, e, 0, true
end

local function algo__encode(start, count)
  return struct.pack('<Bi8I4', algo__TAG, start, count)
end

local function algo__retry(l, s, e, count, now, cost)
  if cost <= l - count then return 0 end
  if cost <= l then return e - now end
  return math.max(e - now, e - s)
end

local function algo_available(p, st, now)
  local l, _, _, per, off = algo__norm(p)
  local _, _, count = algo__load(per, off, st or '', now)
  return l - count
end

local function algo_take(p, st, now, n)
  local _, _, _, per, off = algo__norm(p)
  local s, _, count = algo__load(per, off, st or '', now)
  count = math.min(count + math.min(math.max(n, 0), algo__MAX_COUNT), algo__MAX_COUNT)
  return algo__encode(s, count)
end

local function algo_refund(p, st, now, n)
  local _, _, _, per, off = algo__norm(p)
  local s, _, count = algo__load(per, off, st or '', now)
  count = math.max(count - math.min(math.max(n, 0), algo__MAX_COUNT), 0)
  return algo__encode(s, count)
end

local function algo_reset_at(p, st, now)
  local _, _, _, per, off = algo__norm(p)
  local _, e = algo__load(per, off, st or '', now)
  return e
end

local function algo_retry_after(p, st, now, cost)
  local l, _, _, per, off = algo__norm(p)
  local s, e, count = algo__load(per, off, st or '', now)
  return algo__retry(l, s, e, count, now, math.max(cost, 0))
end

local function algo_decide(p, st, now, cost)
  st = st or ''
  cost = math.max(cost, 0)
  local l, _, _, per, off = algo__norm(p)
  local s, e, count, moved = algo__load(per, off, st, now)
  local avail = l - count
  if cost > avail then
    if moved then st = algo__encode(s, count) end
    return 0, st, math.max(avail, 0), e, algo__retry(l, s, e, count, now, cost)
  end
  return 1, algo__encode(s, count + cost), avail - cost, e, 0
end

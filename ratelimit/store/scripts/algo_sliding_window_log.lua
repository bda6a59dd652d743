-- algo_sliding_window_log.lua: the exact sliding window log of shared/algo (Kind
-- sliding_window_log), the same integer math on the same variable-length state (runs of
-- (time, count) as uvarints, shared/algo/ENCODING.md), for the sync service's
-- per-algorithm script. A fragment: it defines local functions only and is concatenated
-- before the lease preamble (see README.md in this directory).
--
-- A permit taken at t counts while t > now - w. The state is O(limit): every call decodes
-- and re-encodes the whole log.
--
-- p is {limit=, window_us=, burst=} (burst ignored), st the binary state ('' = fresh),
-- times in µs.
--   algo_available(p, st, now)          -> permits that could be taken now (< 0 in debt)
--   algo_take(p, st, now, n)            -> st   (consume n unconditionally, may go into debt)
--   algo_refund(p, st, now, n)          -> st   (give back the n newest permits)
--   algo_decide(p, st, now, cost)       -> allowed (0/1), st, remaining, reset_us, retry_us
--   algo_reset_at(p, st, now)           -> absolute µs when the newest permit leaves the window
--   algo_retry_after(p, st, now, cost)  -> µs until cost fits (0: now)
-- Every value stays an exact integer below 2^53.

local algo__TAG = 0x12
-- include: window.lua

-- algo__uvarint reads a base-128 varint of at most 8 bytes at i: value, next i (nil on
-- a truncated or over-long varint).
local function algo__uvarint(st, i, len)
  local v, mul = 0, 1
  for _ = 1, 8 do
    if i > len then return nil, i end
    local b = string.byte(st, i)
    i = i + 1
    if b < 128 then return v + b * mul, i end
    v = v + (b - 128) * mul
    mul = mul * 128
  end
  return nil, i
end

-- algo__decode: arrays of run times and counts, or nil for a malformed log.
local function algo__decode(st)
  local len = #st
  if len == 0 then return {}, {} end
  if len <= 9 or string.byte(st, 1) ~= algo__TAG then return nil end
  local _, t = struct.unpack('<Bi8', st)
  if not (t > -algo__EXACT and t < algo__EXACT) then return nil end
  local ts, cnt, k, i = {}, {}, 0, 10
  while i <= len do
    local d, c
    d, i = algo__uvarint(st, i, len)
    if not d or d >= algo__EXACT then return nil end
    c, i = algo__uvarint(st, i, len)
    if not c or c < 1 or c > algo__MAX_COUNT then return nil end
    t = t + d
    if t >= algo__EXACT then return nil end
    k = k + 1
    ts[k], cnt[k] = t, c
  end
  return ts, cnt
end

-- algo__load: the runs still in the window, and whether they differ from st. A
-- malformed log, or one whose newest run is more than a window after now, is fresh.
local function algo__load(w, st, now)
  local ts, cnt = algo__decode(st)
  if not ts or (#ts > 0 and ts[#ts] - now > w) then return {}, {}, #st > 0 end
  local i = 1
  while i <= #ts and ts[i] <= now - w do i = i + 1 end
  if i == 1 then return ts, cnt, false end
  local t2, c2 = {}, {}
  for j = i, #ts do
    t2[j - i + 1], c2[j - i + 1] = ts[j], cnt[j]
  end
  return t2, c2, true
end

-- algo__cap merges the oldest runs into one (at the newest of their times) until at
-- most l + SLACK remain.
local function algo__cap(l, ts, cnt)
  local k = #ts - (l + algo__SLACK)
  if k <= 0 then return ts, cnt end
  local sum = 0
  for j = 1, k + 1 do sum = math.min(sum + cnt[j], algo__MAX_COUNT) end
  local t2, c2 = {ts[k + 1]}, {sum}
  for j = k + 2, #ts do
    t2[j - k], c2[j - k] = ts[j], cnt[j]
  end
  return t2, c2
end

local function algo__put(bytes, nb, v)
  while v >= 128 do
    local b = v % 128
    nb = nb + 1
    bytes[nb] = b + 128
    v = (v - b) / 128
  end
  nb = nb + 1
  bytes[nb] = v
  return nb
end

local function algo__encode(l, ts, cnt)
  ts, cnt = algo__cap(l, ts, cnt)
  if #ts == 0 then return '' end
  local bytes, nb, prev = {}, 0, ts[1]
  for j = 1, #ts do
    nb = algo__put(bytes, nb, ts[j] - prev)
    nb = algo__put(bytes, nb, cnt[j])
    prev = ts[j]
  end
  local parts = {struct.pack('<Bi8', algo__TAG, ts[1])}
  for i = 1, nb, 4096 do
    parts[#parts + 1] = string.char(unpack(bytes, i, math.min(i + 4095, nb)))
  end
  return table.concat(parts)
end

local function algo__sum(cnt)
  local s = 0
  for j = 1, #cnt do s = s + cnt[j] end
  return s
end

-- algo__append records k permits at now (or at the newest run's time if the clock
-- stepped back, so the log stays ordered).
local function algo__append(ts, cnt, now, k)
  if k <= 0 then return end
  local n = #ts
  if n > 0 and ts[n] >= now then
    cnt[n] = math.min(cnt[n] + k, algo__MAX_COUNT)
    return
  end
  ts[n + 1], cnt[n + 1] = now, k
end

local function algo__reset(w, ts, now)
  if #ts == 0 then return now end
  return ts[#ts] + w
end

local function algo__retry(l, w, ts, cnt, now, cost)
  local used = algo__sum(cnt)
  if cost <= l - used then return 0 end
  if cost > l then return math.max(algo__reset(w, ts, now) - now, w) end
  local need = used - (l - cost)
  for j = 1, #ts do
    need = need - cnt[j]
    if need <= 0 then return ts[j] + w - now end
  end
  return algo__reset(w, ts, now) - now
end

local function algo_available(p, st, now)
  local l, w = algo__norm(p)
  local _, cnt = algo__load(w, st or '', now)
  return l - algo__sum(cnt)
end

local function algo_take(p, st, now, n)
  local l, w = algo__norm(p)
  local ts, cnt = algo__load(w, st or '', now)
  algo__append(ts, cnt, now, math.min(math.max(n, 0), algo__MAX_COUNT))
  return algo__encode(l, ts, cnt)
end

-- the newest permits go back first: a returned lease is the most recent grant
local function algo_refund(p, st, now, n)
  local l, w = algo__norm(p)
  local ts, cnt = algo__load(w, st or '', now)
  local keep = math.max(algo__sum(cnt) - math.max(n, 0), 0)
  local t2, c2 = {}, {}
  for j = 1, #ts do
    if keep <= 0 then break end
    local c = math.min(cnt[j], keep)
    t2[j], c2[j] = ts[j], c
    keep = keep - c
  end
  return algo__encode(l, t2, c2)
end

local function algo_reset_at(p, st, now)
  local _, w = algo__norm(p)
  local ts = algo__load(w, st or '', now)
  return algo__reset(w, ts, now)
end

local function algo_retry_after(p, st, now, cost)
  local l, w = algo__norm(p)
  local ts, cnt = algo__load(w, st or '', now)
  return algo__retry(l, w, ts, cnt, now, math.max(cost, 0))
end

local function algo_decide(p, st, now, cost)
  st = st or ''
  cost = math.max(cost, 0)
  local l, w = algo__norm(p)
  local ts, cnt, moved = algo__load(w, st, now)
  local avail = l - algo__sum(cnt)
  if cost > avail then
    if moved then st = algo__encode(l, ts, cnt) end
    return 0, st, math.max(avail, 0), algo__reset(w, ts, now), algo__retry(l, w, ts, cnt, now, cost)
  end
  algo__append(ts, cnt, now, cost)
  return 1, algo__encode(l, ts, cnt), avail - cost, algo__reset(w, ts, now), 0
end

-- algo_common.lua: helpers every algorithm fragment shares. Not named after an
-- algorithm, so the store puts it before every fragment (see buildScripts); it defines
-- local functions only.

-- The bounds of shared/algo (algo.go); the differential tests check every copy against
-- the Go constants, so the two cannot drift.
local algo__MAX_LIMIT = 1000000000        -- algo.MaxLimit
local algo__MAX_LOG_LIMIT = 10000         -- algo.MaxLogLimit
local algo__MAX_BURST = 1000000000        -- algo.MaxBurst
local algo__MIN_WINDOW = 1000             -- algo.MinWindowUs
local algo__MAX_WINDOW = 2678400000000    -- algo.MaxWindowUs (31 days)
local algo__MAX_REFILL = 562949953421312  -- algo.MaxRefillUs (2^49)
local algo__MAX_AHEAD = 1125899906842624  -- algo.MaxAheadUs (2^50)
local algo__MAX_COUNT = 4294967295        -- algo.MaxCount
local algo__SLACK = 64                    -- algo.LogSlack
local algo__EXACT = 9007199254740992      -- 2^53

-- algo__muldivrem(a, b, c) = floor(a*b/c), a*b mod c for integers 0 <= a, b < 2^53,
-- 1 <= c < 2^42 and a quotient below 2^53 (Go's mulDivRem). a = q*c + r with r < c, so
-- a*b/c = q*b + r*b/c; r*b/c is long division of r*b by c, b's digits in base 2^10 from
-- the top: each partial dividend hr*2^10 + r*d (hr, r < c, d < 2^10) stays below
-- c*2^11 < 2^53, so every step is exact. Base 2^10 is the largest that keeps divisors up
-- to MaxWindowUs (31 days < 2^42 µs) exact.
--
-- Most calls need no long division: a product ab below 2^52 is exact in a double, and
-- so is floor(ab/c): ab/c = q + r/c lies at least 1/c below q + 1, while the double
-- division errs by at most ab/c * 2^-53 < 1/(2c), so it rounds to [q, q + 1). That path
-- costs a tenth of the digit loop, which every algorithm call used to run a few times.
local algo__DIGIT = 1024
local algo__FAST = 4503599627370496 -- 2^52
local function algo__muldivrem(a, b, c)
  if a <= 0 or b <= 0 or c <= 0 then return 0, 0 end
  local ab = a * b
  if ab < algo__FAST then
    local q = math.floor(ab / c)
    return q, ab - q * c
  end
  local q = math.floor(a / c)
  local r = a - q * c
  local hq, hr, rest, place = 0, 0, b, 1125899906842624 -- 2^50: b < 2^53 has 6 digits
  for _ = 1, 6 do
    local d = math.floor(rest / place)
    rest = rest - d * place
    local t = hr * algo__DIGIT + r * d
    local qt = math.floor(t / c)
    hr = t - qt * c
    hq = hq * algo__DIGIT + qt
    place = place / algo__DIGIT
  end
  return q * b + hq, hr
end

local function algo__clamp(v, lo, hi)
  if v < lo then return lo end
  if v > hi then return hi end
  return v
end

-- Calendar periods (shared/algo/calendar.go): the period and UTC offset of a calendar
-- window travel in burst as period*10000 + offset_minutes + 1440 (period 1 day, 2 ISO
-- week, 3 month). Integer day counting, step for step Go's; every value is an integer
-- far below 2^53 and every division a math.floor of integers.
local algo__DAY = 86400000000

-- algo__cal_norm(code) -> period, offset (µs), clamped as Go's calNorm.
local function algo__cal_norm(code)
  local c = algo__clamp(math.floor(tonumber(code) or 0), 10600, 32280)
  local q = math.floor(c / 10000)
  return q, algo__clamp(c - q * 10000 - 1440, -840, 840) * 60000000
end

-- days from 1970-01-01 to y-m-d, proleptic Gregorian (Hinnant's days_from_civil)
local function algo__days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = m + 9
  if m > 2 then mp = m - 3 end
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end

-- the inverse (Hinnant's civil_from_days): y, m, d of day z
local function algo__civil_from_days(z)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp + 3
  if mp >= 10 then m = mp - 9 end
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m, d
end

-- algo__cal_window(per, off, now) -> index, start, end (µs) of the period containing
-- now (Go calWindow). Day 0, 1970-01-01, was a Thursday: Monday is day -3.
local function algo__cal_window(per, off, now)
  local day = math.floor((now + off) / algo__DAY)
  local idx, s, e
  if per == 1 then
    idx, s, e = day, day, day + 1
  elseif per == 2 then
    idx = math.floor((day + 3) / 7)
    s = idx * 7 - 3
    e = s + 7
  else
    local y, m, d = algo__civil_from_days(day)
    idx = y * 12 + m - 1
    s = day - d + 1
    if m == 12 then
      e = algo__days_from_civil(y + 1, 1, 1)
    else
      e = algo__days_from_civil(y, m + 1, 1)
    end
  end
  return idx, s * algo__DAY - off, e * algo__DAY - off
end

-- algo__cal_shortest(code) -> the shortest length (µs) of the period: 28 days a month
local function algo__cal_shortest(code)
  local per = algo__cal_norm(code)
  if per == 1 then return algo__DAY end
  if per == 2 then return 7 * algo__DAY end
  return 28 * algo__DAY
end

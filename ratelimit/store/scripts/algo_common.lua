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

-- algo_common.lua: helpers every algorithm fragment shares. Not named after an
-- algorithm, so the store puts it before every fragment (see buildScripts); it defines
-- local functions only.

-- algo__muldivrem(a, b, c) = floor(a*b/c), a*b mod c for integers a, b >= 0, 1 <= c < 2^37
-- and a quotient below 2^53: long division of a*b by c in base 2^15.
local function algo__muldivrem(a, b, c)
  if a <= 0 or b <= 0 or c <= 0 then return 0, 0 end
  local q = math.floor(a / c)
  local r = a - q * c
  local d3 = math.floor(b / 35184372088832) -- 2^45
  local rest = b - d3 * 35184372088832
  local d2 = math.floor(rest / 1073741824)  -- 2^30
  rest = rest - d2 * 1073741824
  local d1 = math.floor(rest / 32768)
  local d0 = rest - d1 * 32768
  local hq, hr, t, qt = 0, 0, 0, 0
  t = r * d3; qt = math.floor(t / c); hr = t - qt * c; hq = qt
  t = hr * 32768 + r * d2; qt = math.floor(t / c); hr = t - qt * c; hq = hq * 32768 + qt
  t = hr * 32768 + r * d1; qt = math.floor(t / c); hr = t - qt * c; hq = hq * 32768 + qt
  t = hr * 32768 + r * d0; qt = math.floor(t / c); hr = t - qt * c; hq = hq * 32768 + qt
  return q * b + hq, hr
end

local function algo__clamp(v, lo, hi)
  if v < lo then return lo end
  if v > hi then return hi end
  return v
end

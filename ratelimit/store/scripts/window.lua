-- window.lua: what the window algorithms (fixed_window, sliding_window_counter,
-- sliding_window_log) share, included by their fragments after they define algo__TAG
-- (the store expands "-- include:" lines).

-- the largest limit: the log's state is O(limit), so it has a bound of its own
local algo__LIMIT_CAP = algo__MAX_LIMIT
if algo__TAG == 0x12 then algo__LIMIT_CAP = algo__MAX_LOG_LIMIT end

-- algo__norm clamps p exactly as Go's Params.norm: limit, window.
local function algo__norm(p)
  local l = algo__clamp(math.floor(tonumber(p.limit) or 0), 1, algo__LIMIT_CAP)
  local w = algo__clamp(math.floor(tonumber(p.window_us) or 0), algo__MIN_WINDOW, algo__MAX_WINDOW)
  if w < l then w = l end
  return l, w
end

-- algo__start returns the window start stored in st, or nil when st is to be treated
-- as fresh: malformed, not aligned to w, or more than one window after cur.
local function algo__start(w, st, size, cur)
  if #st ~= size or string.byte(st, 1) ~= algo__TAG then return nil end
  local _, s = struct.unpack('<Bi8', st)
  if not (s > -algo__EXACT and s < algo__EXACT) then return nil end
  if s - math.floor(s / w) * w ~= 0 or s - cur > w then return nil end
  return s
end

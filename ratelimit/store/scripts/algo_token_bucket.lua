-- algo_token_bucket.lua: the token bucket of shared/algo (Kind token_bucket), the same
-- integer math on the same 13-byte state (shared/algo/ENCODING.md), for the sync
-- service's per-algorithm script. A fragment: it defines local functions only and is
-- concatenated before the lease preamble (see README.md in this directory).
--
-- p is {limit=, window_us=, burst=}, st the binary state ('' = fresh), times in µs.
--   algo_available(p, st, now)          -> permits that could be taken now (< 0 in debt)
--   algo_take(p, st, now, n)            -> st   (consume n unconditionally, may go into debt)
--   algo_refund(p, st, now, n)          -> st   (give n back, never above full)
--   algo_decide(p, st, now, cost)       -> allowed (0/1), st, remaining, reset_us, retry_us
--   algo_reset_at(p, st, now)           -> absolute µs when the bucket is full again
--   algo_retry_after(p, st, now, cost)  -> µs until cost fits (0: now)
-- Every value stays an exact integer below 2^53; products that would not go through
-- algo__muldivrem.

local algo__TAG = 0x10
-- include: bucket.lua

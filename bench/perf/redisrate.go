package perf

import (
	"context"
	"fmt"
	"strconv"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
)

// pinnedTimeScript is prepended to a script so that redis.call('TIME') answers the
// last two ARGV instead of the server clock: a local `redis` shadows the global for the
// script's chunk and passes every other call through. It lets go-redis/redis_rate's
// unmodified script run on a virtual clock, so the same request sequence (times and
// costs) can be replayed through it and through Tollgate's GCRA.
const pinnedTimeScript = `local redis = setmetatable({call = function(cmd, ...)
  if string.upper(cmd) == 'TIME' then return {ARGV[#ARGV - 1], ARGV[#ARGV]} end
  return redis.call(cmd, ...)
end}, {__index = redis})
`

// PinnedClock is a go-redis client for redis_rate whose scripts see a pinned TIME.
// EVALSHA always answers NOSCRIPT, so redis.Script.Run falls back to EVAL, which sends
// the script with pinnedTimeScript in front and the pinned time appended to ARGV (the
// redis_rate script reads ARGV[1..4] by index, so two extra values are invisible to it).
type PinnedClock struct {
	*redis.Client
	NowUs int64 // the time TIME returns, µs since the Unix epoch
}

// EvalSha forces the EVAL path.
func (p *PinnedClock) EvalSha(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(redis.ErrNoScript)
	return cmd
}

// EvalShaRO forces the EVAL_RO path.
func (p *PinnedClock) EvalShaRO(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(redis.ErrNoScript)
	return cmd
}

// Eval runs script on the pinned clock.
func (p *PinnedClock) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	sec, usec := p.NowUs/1e6, p.NowUs%1e6
	args = append(append([]any(nil), args...), strconv.FormatInt(sec, 10), strconv.FormatInt(usec, 10))
	return p.Client.Eval(ctx, pinnedTimeScript+script, keys, args...)
}

// LimiterOnClock returns a redis_rate limiter whose clock is pc.
func LimiterOnClock(pc *PinnedClock) *redis_rate.Limiter { return redis_rate.NewLimiter(pc) }

// gcraHarness runs one decision of the GCRA fragment the sync service embeds.
// ARGV: limit, window_us, burst, state, now_us, cost. Returns allowed, state,
// remaining, reset_us, retry_us.
const gcraHarness = `
local p = {limit = tonumber(ARGV[1]), window_us = tonumber(ARGV[2]), burst = tonumber(ARGV[3])}
local allowed, st, rem, reset, retry = algo_decide(p, ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]))
return {allowed, st, rem, reset, retry}
`

// LuaGCRA runs Tollgate's GCRA as the service's Lua does: the store's resolved
// fragment (store.Fragment: shared helpers, ratelimit/store/scripts/algo_gcra.lua and the
// bucket math it includes) under a one-decision harness.
type LuaGCRA struct {
	script *redis.Script
	rdb    *redis.Client
}

// LoadLuaGCRA builds the script from the store's embedded fragments.
func LoadLuaGCRA(rdb *redis.Client) (*LuaGCRA, error) {
	frag, err := store.Fragment(algo.GCRA)
	if err != nil {
		return nil, fmt.Errorf("GCRA fragment: %w", err)
	}
	return &LuaGCRA{script: redis.NewScript(frag + gcraHarness), rdb: rdb}, nil
}

// Decide runs one decision in Redis.
func (l *LuaGCRA) Decide(ctx context.Context, p algo.Params, st algo.State, now, cost int64) (algo.Result, error) {
	v, err := l.script.Run(ctx, l.rdb, nil, p.Limit, p.WindowUs, p.Burst, string(st), now, cost).Slice()
	if err != nil {
		return algo.Result{}, fmt.Errorf("GCRA script: %w", err)
	}
	if len(v) != 5 {
		return algo.Result{}, fmt.Errorf("GCRA script: %d values", len(v))
	}
	ints := make([]int64, 5)
	for _, i := range []int{0, 2, 3, 4} {
		n, ok := v[i].(int64)
		if !ok {
			return algo.Result{}, fmt.Errorf("GCRA script: value %d is %T", i, v[i])
		}
		ints[i] = n
	}
	s, ok := v[1].(string)
	if !ok {
		return algo.Result{}, fmt.Errorf("GCRA script: state is %T", v[1])
	}
	return algo.Result{Allowed: ints[0] == 1, State: algo.State(s), Remaining: ints[2], ResetUs: ints[3], RetryAfterUs: ints[4]}, nil
}

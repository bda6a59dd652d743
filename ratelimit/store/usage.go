package store

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// paramsSeen records, once per process, every (rule, window, tier) a batch carried and
// its parameters in the hash tg:params, so that usage and reset of a caller key can name
// the key's buckets directly (one GET or DEL each) instead of scanning the keyspace.
type paramsSeen struct {
	mu   sync.Mutex
	seen map[string]string
}

func (p *paramsSeen) init() { p.seen = map[string]string{} }

// paramsField names one (rule, window, tier): unit separators cannot appear in a rule id.
func paramsField(rule string, window uint8, tier string) string {
	return rule + "\x1f" + strconv.Itoa(int(window)) + "\x1f" + tier
}

// note writes what the applied deltas of b (applied[i]) carry that this process has not
// written yet. Refused deltas are skipped: their parameters are out of range or not the
// service's, and would replace those of the buckets that exist. A failure is forgotten:
// the next batch that carries the bucket writes it again.
func (p *paramsSeen) note(ctx context.Context, s *Store, b *wire.Batch, applied []bool) {
	var fresh []any
	p.mu.Lock()
	for i := range b.Deltas {
		if !applied[i] {
			continue
		}
		d := &b.Deltas[i]
		f := paramsField(d.Rule, d.Window, d.Tier)
		v := lease.FormatParams(lease.ParamsOf(d))
		if p.seen[f] != v && len(p.seen) < maxParams {
			p.seen[f] = v
			fresh = append(fresh, f, v)
		}
	}
	p.mu.Unlock()
	if len(fresh) == 0 {
		return
	}
	if err := s.rdb.HSet(ctx, paramsKey, fresh...).Err(); err != nil {
		p.mu.Lock()
		for i := 0; i < len(fresh); i += 2 {
			delete(p.seen, fresh[i].(string))
		}
		p.mu.Unlock()
	}
}

// maxParams bounds the registry (rule ids come from rule sets, but a gateway could send
// anything).
const maxParams = 10_000

// Usage is the state of every bucket of one caller key.
type Usage struct {
	Key     string        `json:"key"`
	NowUs   int64         `json:"now_us"`
	Buckets []BucketUsage `json:"buckets"`
	Penalty PenaltyUsage  `json:"penalty"`
}

// BucketUsage is one bucket.
type BucketUsage struct {
	RedisKey  string `json:"redis_key"`
	Rule      string `json:"rule"`
	Tier      string `json:"tier,omitempty"`
	Window    int    `json:"window"`
	Algorithm string `json:"algorithm"`
	Limit     int64  `json:"limit"`
	WindowMs  int64  `json:"window_ms"`
	Burst     int64  `json:"burst"`
	// Calendar is set for a calendar window (algorithm fixed_window, window_ms the
	// period's longest length, reset_in_ms the time to the next boundary).
	Calendar *CalendarUsage `json:"calendar,omitempty"`
	// Remaining counts every outstanding lease as taken; Consumed is what gateways
	// reported consumed (the bucket's own state), Outstanding what they hold in leases.
	Remaining   int64 `json:"remaining"`
	Available   int64 `json:"available_without_leases"`
	ResetInMs   int64 `json:"reset_in_ms"`
	Outstanding int64 `json:"outstanding"`
}

// CalendarUsage is a calendar window's period, as the rule writes it.
type CalendarUsage struct {
	Period    string `json:"period"`
	UTCOffset string `json:"utc_offset"`
}

// describe is how a bucket's parameters read in a usage answer: a calendar window is
// the fixed_window with a calendar its rule configured (its Burst is the encoded period).
func describe(p algo.Params) (name string, burst int64, cal *CalendarUsage) {
	if per, off, ok := p.Calendar(); ok {
		return algo.FixedWindow.String(), 0, &CalendarUsage{Period: per.String(), UTCOffset: algo.FormatOffset(off)}
	}
	return p.Kind.String(), p.Burst, nil
}

// PenaltyUsage is the key's progressive-penalty state.
type PenaltyUsage struct {
	Level       int64 `json:"level"`
	RemainingMs int64 `json:"remaining_ms"`
}

// bucketRef is one bucket a caller key may have.
type bucketRef struct {
	rule, tier string
	window     int
	params     algo.Params
}

// knownBuckets reads the registry of (rule, window, tier) and their parameters.
func (s *Store) knownBuckets(ctx context.Context) ([]bucketRef, error) {
	all, err := s.rdb.HGetAll(ctx, paramsKey).Result()
	if err != nil {
		return nil, err
	}
	refs := make([]bucketRef, 0, len(all))
	for f, v := range all {
		parts := strings.Split(f, "\x1f")
		if len(parts) != 3 {
			continue
		}
		w, err := strconv.Atoi(parts[1])
		p, ok := lease.ParseParams(v)
		// Out-of-range parameters (written before refused deltas were skipped) name no
		// bucket the store applied.
		if err != nil || !ok || w < 0 || w > 255 || p.Validate() != nil {
			continue
		}
		refs = append(refs, bucketRef{rule: parts[0], window: w, tier: parts[2], params: p})
	}
	sort.Slice(refs, func(i, j int) bool {
		a, b := refs[i], refs[j]
		if a.rule != b.rule {
			return a.rule < b.rule
		}
		if a.window != b.window {
			return a.window < b.window
		}
		return a.tier < b.tier
	})
	return refs, nil
}

// Usage reads every bucket of key at Redis time: one GET per (rule, window, tier) the
// service knows, all in one slot, in one round trip. It does not scan: the time is the
// same with a thousand callers as with a million.
func (s *Store) Usage(ctx context.Context, key string) (*Usage, error) {
	refs, err := s.knownBuckets(ctx)
	if err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	pipe := s.rdb.Pipeline()
	tm := pipe.Time(ctx)
	penCmd := pipe.HGetAll(ctx, PenaltyKey(key))
	cmds := make([]*redis.StringCmd, len(refs))
	for i, r := range refs {
		cmds[i] = pipe.Get(ctx, BucketKey(key, r.rule, r.tier, uint8(r.window)))
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	now := tm.Val().UnixMicro()
	if s.nowUs != nil {
		now = s.nowUs()
	}
	u := &Usage{Key: key, NowUs: now, Buckets: []BucketUsage{}}
	p := lease.ParsePenalty(penCmd.Val())
	u.Penalty = PenaltyUsage{Level: p.Level, RemainingMs: ceilMs(p.UntilUs - now)}
	for i, r := range refs {
		v, err := cmds[i].Bytes()
		if err != nil {
			continue
		}
		b := lease.ParseValue(v)
		bp := r.params
		b.Advance(bp, now, s.cfg.Lease) // leases of an ended epoch or window no longer count
		eff := algo.Take(bp, b.State, now, b.Leases.Outstanding())
		name, burst, cal := describe(bp)
		u.Buckets = append(u.Buckets, BucketUsage{
			RedisKey: BucketKey(key, r.rule, r.tier, uint8(r.window)), Rule: r.rule, Tier: r.tier, Window: r.window,
			Algorithm: name, Limit: bp.Limit, WindowMs: bp.WindowUs / 1000, Burst: burst, Calendar: cal,
			Remaining: algo.Available(bp, eff, now), Available: algo.Available(bp, b.State, now),
			ResetInMs: ceilMs(algo.ResetAt(bp, b.State, now) - now), Outstanding: b.Leases.Outstanding(),
		})
	}
	return u, nil
}

// Reset deletes every bucket of key and its penalty record, and returns how many Redis
// keys it deleted. Gateways keep their local leases until they report them, which the
// fresh bucket then no longer reserves (they are renewed as nothing).
func (s *Store) Reset(ctx context.Context, key string) (int64, error) {
	refs, err := s.knownBuckets(ctx)
	if err != nil {
		return 0, fmt.Errorf("reset: %w", err)
	}
	keys := []string{PenaltyKey(key)}
	for _, r := range refs {
		keys = append(keys, BucketKey(key, r.rule, r.tier, uint8(r.window)))
	}
	var n int64
	// All of them share one slot; delete in slices to keep each command small.
	for i := 0; i < len(keys); i += 500 {
		d, err := s.rdb.Del(ctx, keys[i:min(i+500, len(keys))]...).Result()
		if err != nil {
			return n, fmt.Errorf("reset: %w", err)
		}
		n += d
	}
	return n, nil
}

// MemoryUsage reports Redis's MEMORY USAGE of a bucket (bytes), for sizing.
func (s *Store) MemoryUsage(ctx context.Context, key, rule, tier string, window uint8) (int64, error) {
	return s.rdb.MemoryUsage(ctx, BucketKey(key, rule, tier, window), 0).Result()
}

func ceilMs(us int64) int64 {
	if us <= 0 {
		return 0
	}
	return (us + 999) / 1000
}

package store

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// paramsSeen records every (rule, window, tier) a batch carried and its parameters in
// the hash tg:params, so that usage and reset of a caller key can name the key's buckets
// directly (one GET or DEL each) instead of scanning the keyspace. It is the registry of
// a service without a rule set of its own (Options.NoLearn is off): the gateways' rules
// are then all it knows. With a rule set the service names the buckets from it
// (UsageOf, ResetOf) and nothing a gateway sends is recorded.
//
// Every relearnCheck one batch compares the registry's size in Redis with what this
// process wrote: when Redis holds fewer (FLUSHALL, a restarted Redis without
// persistence), the process forgets what it wrote, and the traffic that follows writes
// the registry again, without a restart.
type paramsSeen struct {
	mu      sync.Mutex
	seen    map[string]string
	checked time.Time
}

// relearnCheck is how often a process checks that what it wrote is still in Redis.
const relearnCheck = time.Second

func (p *paramsSeen) init() { p.seen = map[string]string{}; p.checked = time.Now() }

// paramsField names one (rule, window, tier): unit separators cannot appear in a rule id.
func paramsField(rule string, window uint8, tier string) string {
	return rule + "\x1f" + strconv.Itoa(int(window)) + "\x1f" + tier
}

// note writes what the applied deltas of b (applied[i]) carry that this process has not
// written yet. Refused deltas are skipped: their parameters are out of range or not the
// service's, and would replace those of the buckets that exist. A failure is forgotten:
// the next batch that carries the bucket writes it again.
func (p *paramsSeen) note(ctx context.Context, s *Store, b *wire.Batch, applied []bool) {
	p.mu.Lock()
	check := time.Since(p.checked) >= relearnCheck
	if check {
		p.checked = time.Now()
	}
	wrote := len(p.seen)
	p.mu.Unlock()
	if check {
		if n, err := s.rdb.HLen(ctx, paramsKey).Result(); err == nil && n < int64(wrote) {
			p.mu.Lock()
			p.seen = map[string]string{}
			p.mu.Unlock()
		}
	}
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
	// The bound holds in Redis too, over every process and every relearning: a full
	// registry takes new parameters of the (rule, window, tier) it has, no new ones.
	write := fresh
	n, err := s.rdb.HLen(ctx, paramsKey).Result()
	if err == nil && n+int64(len(fresh)/2) > maxParams {
		write, err = keepKnown(ctx, s, slices.Clone(fresh))
	}
	if err == nil && len(write) > 0 {
		err = s.rdb.HSet(ctx, paramsKey, write...).Err()
	}
	if err != nil {
		p.mu.Lock()
		for i := 0; i < len(fresh); i += 2 {
			delete(p.seen, fresh[i].(string))
		}
		p.mu.Unlock()
	}
}

// keepKnown returns the field/value pairs of fresh whose field the registry holds.
func keepKnown(ctx context.Context, s *Store, fresh []any) ([]any, error) {
	fields := make([]string, 0, len(fresh)/2)
	for i := 0; i < len(fresh); i += 2 {
		fields = append(fields, fresh[i].(string))
	}
	have, err := s.rdb.HMGet(ctx, paramsKey, fields...).Result()
	if err != nil {
		return nil, err
	}
	kept := fresh[:0]
	for i, v := range have {
		if v != nil {
			kept = append(kept, fresh[2*i], fresh[2*i+1])
		}
	}
	return kept, nil
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
		return p.Kind.ConfiguredAs().String(), 0, &CalendarUsage{Period: per.String(), UTCOffset: algo.FormatOffset(off)}
	}
	return p.Kind.String(), p.Burst, nil
}

// PenaltyUsage is the key's progressive-penalty state.
type PenaltyUsage struct {
	Level       int64 `json:"level"`
	RemainingMs int64 `json:"remaining_ms"`
}

// BucketRef is one bucket a caller key may have: a (rule, window, tier) and the
// parameters it is charged with.
type BucketRef struct {
	Rule, Tier string
	Window     uint8
	Params     algo.Params
}

// knownBuckets reads the registry of (rule, window, tier) and their parameters.
func (s *Store) knownBuckets(ctx context.Context) ([]BucketRef, error) {
	all, err := s.rdb.HGetAll(ctx, paramsKey).Result()
	if err != nil {
		return nil, err
	}
	refs := make([]BucketRef, 0, len(all))
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
		refs = append(refs, BucketRef{Rule: parts[0], Window: uint8(w), Tier: parts[2], Params: p})
	}
	SortBuckets(refs)
	return refs, nil
}

// SortBuckets orders refs by rule, window and tier (the order usage lists them in).
func SortBuckets(refs []BucketRef) {
	sort.Slice(refs, func(i, j int) bool {
		a, b := refs[i], refs[j]
		if a.Rule != b.Rule {
			return a.Rule < b.Rule
		}
		if a.Window != b.Window {
			return a.Window < b.Window
		}
		return a.Tier < b.Tier
	})
}

// Usage reads every bucket of key at Redis time: one GET per (rule, window, tier) the
// service knows, all in one slot, in one round trip. It does not scan: the time is the
// same with a thousand callers as with a million.
func (s *Store) Usage(ctx context.Context, key string) (*Usage, error) {
	refs, err := s.knownBuckets(ctx)
	if err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	return s.UsageOf(ctx, key, refs)
}

// UsageOf reads key's buckets among refs (those that exist), as Usage does: a service
// with a rule set names them from it, so no registry a gateway could fill or a wipe of
// Redis could empty stands between the rules and the answer.
func (s *Store) UsageOf(ctx context.Context, key string, refs []BucketRef) (*Usage, error) {
	pipe := s.rdb.Pipeline()
	tm := pipe.Time(ctx)
	penCmd := pipe.HGetAll(ctx, PenaltyKey(key))
	cmds := make([]*redis.StringCmd, len(refs))
	for i, r := range refs {
		cmds[i] = pipe.Get(ctx, BucketKey(key, r.Rule, r.Tier, r.Window))
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
		bp := r.Params
		b.Advance(bp, now, s.cfg.Lease) // leases of an ended epoch or window no longer count
		eff := algo.Take(bp, b.State, now, b.Leases.Outstanding())
		name, burst, cal := describe(bp)
		u.Buckets = append(u.Buckets, BucketUsage{
			RedisKey: BucketKey(key, r.Rule, r.Tier, r.Window), Rule: r.Rule, Tier: r.Tier, Window: int(r.Window),
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
	return s.ResetOf(ctx, key, refs)
}

// ResetOf deletes key's buckets among refs and its penalty record, as Reset does.
func (s *Store) ResetOf(ctx context.Context, key string, refs []BucketRef) (int64, error) {
	keys := []string{PenaltyKey(key)}
	for _, r := range refs {
		keys = append(keys, BucketKey(key, r.Rule, r.Tier, r.Window))
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

// Package top tracks, per rule, the caller keys with the most refusals and the most
// consumption over the last minutes, in bounded memory whatever the number of keys.
//
// Each service replica counts the deltas it applies in a small in-process Space-Saving
// sketch per rule and measure (Sketch), and every flush interval adds the sketch's
// entries to a capped Redis sorted set per rule, measure and minute (ZINCRBY, then
// ZREMRANGEBYRANK to the cap and EXPIRE, in one pipeline), then starts a fresh sketch.
// The sorted sets are shared, so the answer is the fleet's, not one replica's, and the
// Redis cost is paid once per flush and key kept, not once per delta (RATIONALE.md,
// "Hot keys"). Reading merges the last minutes' sets.
//
// Caller keys are personal data (often credentials): the tracker stores and answers
// their hashes (the same hash the service's logs use) unless the operator asks for raw
// keys.
package top

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
)

// By names what a top list ranks keys by.
type By string

// The two measures.
const (
	Refused  By = "refused"  // requests refused (gateway 429s and strict checks denied)
	Consumed By = "consumed" // permits admitted
)

// ParseBy reads a measure name.
func ParseBy(s string) (By, error) {
	switch By(s) {
	case Refused, Consumed:
		return By(s), nil
	}
	return "", fmt.Errorf("by %q: want %q or %q", s, Refused, Consumed)
}

// Config bounds the tracker. Zero values take the defaults.
type Config struct {
	// Capacity is the keys each sketch keeps per rule and measure (default 256): the
	// in-process memory is at most MaxRules × 2 × Capacity entries.
	Capacity int
	// Keep is the entries each Redis sorted set keeps (default 1000).
	Keep int
	// Minutes is how far back a top list looks, in whole minutes (default 5); the sorted
	// sets expire one minute after that.
	Minutes int
	// Flush is how often the sketches go to Redis (default 5 s).
	Flush time.Duration
	// MaxRules bounds the rules tracked (rule ids come from gateways; default 1000).
	MaxRules int
	// RawKeys stores and answers caller keys as they are instead of their hashes.
	RawKeys bool
	// Hash names a key when RawKeys is off (the service passes its log hash).
	Hash func(string) string
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	if c.Capacity <= 0 {
		c.Capacity = 256
	}
	if c.Keep <= 0 {
		c.Keep = 1000
	}
	if c.Minutes <= 0 {
		c.Minutes = 5
	}
	if c.Flush <= 0 {
		c.Flush = 5 * time.Second
	}
	if c.MaxRules <= 0 {
		c.MaxRules = 1000
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// MaxN bounds the n of one top list.
const MaxN = 1000

// pair is one rule's two sketches.
type pair struct{ refused, consumed *Sketch }

// Tracker counts deltas and answers top lists. Observe is safe for concurrent use.
type Tracker struct {
	cfg Config
	rdb redis.UniversalClient

	mu    sync.Mutex
	rules map[string]*pair
}

// New returns a tracker that flushes to rdb.
func New(rdb redis.UniversalClient, cfg Config) *Tracker {
	return &Tracker{cfg: cfg.withDefaults(), rdb: rdb, rules: map[string]*pair{}}
}

// Config is the effective configuration.
func (t *Tracker) Config() Config { return t.cfg }

// Observe counts one delta: refused requests and consumed permits of key under rule.
func (t *Tracker) Observe(rule, key string, refused, consumed uint64) {
	if refused == 0 && consumed == 0 {
		return
	}
	if len(rule) > 64 || !utf8.ValidString(rule) {
		return
	}
	name := key
	if !t.cfg.RawKeys && t.cfg.Hash != nil {
		name = t.cfg.Hash(key)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.rules[rule]
	if !ok {
		if len(t.rules) >= t.cfg.MaxRules {
			return
		}
		p = &pair{refused: NewSketch(t.cfg.Capacity), consumed: NewSketch(t.cfg.Capacity)}
		t.rules[rule] = p
	}
	p.refused.Add(name, refused)
	p.consumed.Add(name, consumed)
}

// Entries is the number of keys held in process, over every rule and measure (the
// memory bound is MaxRules × 2 × Capacity).
func (t *Tracker) Entries() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, p := range t.rules {
		n += p.refused.Len() + p.consumed.Len()
	}
	return n
}

// Key is the sorted set of one rule, measure and minute (unix seconds / 60). It is not
// under a caller key's prefix ("tg:{"), so resetting a caller key never touches it.
func Key(rule string, by By, minute int64) string {
	return "tg:top:" + string(by) + ":" + strconv.FormatInt(minute, 10) + ":" + rule
}

// Flush adds the sketches to this minute's sorted sets and starts fresh ones. On an
// error the counts of this interval are lost (the next interval starts fresh anyway):
// top lists are an operator's view, never a decision.
func (t *Tracker) Flush(ctx context.Context) error {
	t.mu.Lock()
	rules := t.rules
	t.rules = make(map[string]*pair, len(rules))
	t.mu.Unlock()
	if len(rules) == 0 {
		return nil
	}
	minute := t.cfg.Now().Unix() / 60
	ttl := time.Duration(t.cfg.Minutes+1) * time.Minute
	pipe := t.rdb.Pipeline()
	for rule, p := range rules {
		for _, s := range []struct {
			by By
			sk *Sketch
		}{{Refused, p.refused}, {Consumed, p.consumed}} {
			if s.sk.Len() == 0 {
				continue
			}
			k := Key(rule, s.by, minute)
			for _, e := range s.sk.h.es {
				pipe.ZIncrBy(ctx, k, float64(e.Count), e.Key)
			}
			pipe.ZRemRangeByRank(ctx, k, 0, int64(-t.cfg.Keep-1))
			pipe.Expire(ctx, k, ttl)
		}
	}
	_, err := pipe.Exec(ctx)
	return err
}

// Run flushes every interval until ctx ends, and once more then (bounded by the
// interval). onErr, if not nil, hears of failed flushes.
func (t *Tracker) Run(ctx context.Context, onErr func(error)) {
	tick := time.NewTicker(t.cfg.Flush)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.cfg.Flush)
			if err := t.Flush(fctx); err != nil && onErr != nil {
				onErr(err)
			}
			cancel()
			return
		case <-tick.C:
			if err := t.Flush(ctx); err != nil && onErr != nil {
				onErr(err)
			}
		}
	}
}

// List is a top list as the admin API answers it.
type List struct {
	Rule    string  `json:"rule"`
	By      By      `json:"by"`
	Minutes int     `json:"minutes"`
	Hashed  bool    `json:"hashed"`
	Keys    []Entry `json:"keys"`
}

// ErrN is returned for an n outside 1..MaxN.
var ErrN = errors.New("n out of range")

// Top reads the n keys of rule with the largest sums over the last Minutes minutes, as
// flushed by every replica (what this replica has not flushed yet is not included).
func (t *Tracker) Top(ctx context.Context, rule string, by By, n int) (*List, error) {
	if n < 1 || n > MaxN {
		return nil, fmt.Errorf("%w: %d (1..%d)", ErrN, n, MaxN)
	}
	now := t.cfg.Now().Unix() / 60
	pipe := t.rdb.Pipeline()
	cmds := make([]*redis.ZSliceCmd, 0, t.cfg.Minutes)
	for m := now - int64(t.cfg.Minutes) + 1; m <= now; m++ {
		cmds = append(cmds, pipe.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: Key(rule, by, m), Start: 0, Stop: int64(t.cfg.Keep - 1), Rev: true}))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	sum := map[string]uint64{}
	for _, c := range cmds {
		zs, err := c.Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		for _, z := range zs {
			if k, ok := z.Member.(string); ok {
				sum[k] += uint64(z.Score)
			}
		}
	}
	keys := make([]Entry, 0, len(sum))
	for k, c := range sum {
		keys = append(keys, Entry{Key: k, Count: c})
	}
	Sort(keys)
	if len(keys) > n {
		keys = keys[:n]
	}
	return &List{Rule: rule, By: by, Minutes: t.cfg.Minutes, Hashed: !t.cfg.RawKeys && t.cfg.Hash != nil, Keys: keys}, nil
}

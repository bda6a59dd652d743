package store

import (
	"context"
	"fmt"
	"sort"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
)

// Usage is the state of every bucket of one caller key.
type Usage struct {
	Key     string        `json:"key"`
	NowUs   int64         `json:"now_us"`
	Buckets []BucketUsage `json:"buckets"`
	Penalty PenaltyUsage  `json:"penalty"`
}

// BucketUsage is one bucket.
type BucketUsage struct {
	RedisKey    string      `json:"redis_key"`
	Rule        string      `json:"rule"`
	Window      int         `json:"window"`
	Algorithm   string      `json:"algorithm"`
	Limit       int64       `json:"limit"`
	WindowMs    int64       `json:"window_ms"`
	Burst       int64       `json:"burst"`
	Remaining   int64       `json:"remaining"`
	ResetInMs   int64       `json:"reset_in_ms"`
	Outstanding int64       `json:"outstanding"`
	Leases      []NodeUsage `json:"leases"`
}

// NodeUsage is one gateway's lease on a bucket.
type NodeUsage struct {
	Node          string  `json:"node"`
	Outstanding   int64   `json:"outstanding"`
	DemandPerSec  float64 `json:"demand_per_second"`
	LastSyncAgoMs int64   `json:"last_sync_ago_ms"`
}

// PenaltyUsage is the key's progressive-penalty state.
type PenaltyUsage struct {
	Level       int64 `json:"level"`
	RemainingMs int64 `json:"remaining_ms"`
}

// maxScan bounds the SCAN iterations of a key lookup on a non-cluster server.
const maxScan = 100000

// keysOf lists the Redis keys of a caller key (buckets and penalty). In a cluster they
// all live in one slot, which CLUSTER GETKEYSINSLOT lists directly; elsewhere SCAN MATCH.
func (s *Store) keysOf(ctx context.Context, key string) (redis.Cmdable, []string, error) {
	prefix := KeyPrefix(key)
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		node, err := cc.MasterForKey(ctx, prefix)
		if err != nil {
			return nil, nil, fmt.Errorf("owner of %q: %w", prefix, err)
		}
		slot, err := node.ClusterKeySlot(ctx, prefix).Result()
		if err != nil {
			return nil, nil, err
		}
		n, err := node.ClusterCountKeysInSlot(ctx, int(slot)).Result()
		if err != nil {
			return nil, nil, err
		}
		all, err := node.ClusterGetKeysInSlot(ctx, int(slot), int(n)).Result()
		if err != nil {
			return nil, nil, err
		}
		var keys []string
		for _, k := range all {
			if len(k) > len(prefix) && k[:len(prefix)+1] == prefix+":" {
				keys = append(keys, k)
			}
		}
		return node, keys, nil
	}
	var keys []string
	var cursor uint64
	match := globEscape(prefix) + ":*"
	for i := 0; i < maxScan; i++ {
		ks, next, err := s.rdb.Scan(ctx, cursor, match, 1000).Result()
		if err != nil {
			return nil, nil, err
		}
		keys = append(keys, ks...)
		if cursor = next; cursor == 0 {
			break
		}
	}
	return s.rdb, keys, nil
}

// Usage reads every bucket of key at Redis time.
func (s *Store) Usage(ctx context.Context, key string) (*Usage, error) {
	c, keys, err := s.keysOf(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("usage of %q: %w", key, err)
	}
	sort.Strings(keys)
	prefix := KeyPrefix(key)
	pen := PenaltyKey(key)
	pipe := c.Pipeline()
	tm := pipe.Time(ctx)
	penCmd := pipe.HGetAll(ctx, pen)
	cmds := make([]*redis.MapStringStringCmd, len(keys))
	for i, k := range keys {
		if k != pen {
			cmds[i] = pipe.HGetAll(ctx, k)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return nil, fmt.Errorf("usage of %q: %w", key, err)
	}
	now := tm.Val().UnixMicro()
	u := &Usage{Key: key, NowUs: now, Buckets: []BucketUsage{}}
	p := lease.ParsePenalty(penCmd.Val())
	u.Penalty = PenaltyUsage{Level: p.Level, RemainingMs: ceilMs(p.UntilUs - now)}
	for i, k := range keys {
		if cmds[i] == nil || len(cmds[i].Val()) == 0 {
			continue
		}
		rule, window, ok := splitBucketKey(prefix, k)
		if !ok {
			continue
		}
		b, _ := lease.ParseBucket(cmds[i].Val())
		bp := b.Params
		bu := BucketUsage{
			RedisKey: k, Rule: rule, Window: window, Algorithm: bp.Kind.String(),
			Limit: bp.Limit, WindowMs: bp.WindowUs / 1000, Burst: bp.Burst,
			Outstanding: b.Outstanding(), Leases: []NodeUsage{},
		}
		if bp.WindowUs > 0 {
			bu.Remaining = algo.Available(bp, b.State, now)
			bu.ResetInMs = ceilMs(algo.ResetAt(bp, b.State, now) - now)
		}
		for n, l := range b.Nodes {
			bu.Leases = append(bu.Leases, NodeUsage{
				Node: n, Outstanding: l.Outstanding, DemandPerSec: float64(l.Demand) / 1000,
				LastSyncAgoMs: (now - l.LastSyncUs) / 1000,
			})
		}
		sort.Slice(bu.Leases, func(i, j int) bool { return bu.Leases[i].Node < bu.Leases[j].Node })
		u.Buckets = append(u.Buckets, bu)
	}
	return u, nil
}

// Reset deletes every bucket of key and its penalty record, and returns how many Redis
// keys it deleted. Gateways keep their local leases until the next sync, whose reply
// then comes from a fresh bucket.
func (s *Store) Reset(ctx context.Context, key string) (int64, error) {
	c, keys, err := s.keysOf(ctx, key)
	if err != nil {
		return 0, fmt.Errorf("reset of %q: %w", key, err)
	}
	keys = append(keys, PenaltyKey(key))
	var n int64
	// All of them share one slot; delete in slices to keep each command small.
	for i := 0; i < len(keys); i += 500 {
		d, err := c.Del(ctx, keys[i:min(i+500, len(keys))]...).Result()
		if err != nil {
			return n, fmt.Errorf("reset of %q: %w", key, err)
		}
		n += d
	}
	return n, nil
}

// MemoryUsage reports Redis's MEMORY USAGE of a bucket's hash (bytes), for sizing.
func (s *Store) MemoryUsage(ctx context.Context, key, rule string, window uint8) (int64, error) {
	return s.rdb.MemoryUsage(ctx, BucketKey(key, rule, window), 0).Result()
}

func ceilMs(us int64) int64 {
	if us <= 0 {
		return 0
	}
	return (us + 999) / 1000
}

package perf

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/internal/wazerohost"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/rule"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Algorithms lists the algorithms a rule names, by configuration name, in algo.Kind
// order (a calendar window is a fixed_window's option, not one of them).
var Algorithms = func() []string {
	var names []string
	for _, k := range rule.Algorithms() {
		names = append(names, k.String())
	}
	return names
}()

// GrowingState reports whether the state of the algorithm named name grows with its
// limit (sliding_window_log's exact log), which puts its memory apart from the others'.
func GrowingState(name string) bool {
	k, ok := algo.ParseKind(name)
	return ok && !k.FixedSizeState()
}

// SharedMem is what the filter keeps in Envoy shared data per bucket. The filter stores
// buckets in a fixed table of slot keys ("tg:s:<n>", filter/plugin/table.go) whose value
// is uvarint(len(id)) ‖ bucket id ‖ encoded lease.Record; the record is the per-bucket
// state, the id (rule, window and caller key) is what lets a slot be shared by hashing.
type SharedMem struct {
	Algo   string
	Synced bool
	Slots  int // slot keys added (one per bucket unless slots collided)
	// RecordBytes is the mean encoded record, MaxRecord the largest; IDBytes the mean
	// bucket id with its length prefix; KeyBytes the mean slot key.
	RecordBytes, IDBytes, KeyBytes float64
	MaxRecord                      int
	// TotalPerBucket is the growth of SharedDataBytes (keys + values) per bucket sent.
	TotalPerBucket float64
	SampleKey      string
	Evictions      int64 // tollgate.bucket_evictions during the run
}

// MeasureSharedData sends one request for each of n keys through the filter (one rule
// of algorithm name at 100/s, synced to the service when synced), waits for the sync to
// fold the replies in, and measures what the new slot entries hold.
func (s *Stack) MeasureSharedData(name string, synced bool, n int) (SharedMem, error) {
	m := SharedMem{Algo: name, Synced: synced}
	cfg := LocalConfig(name, 100)
	if synced {
		cfg = SyncRuleConfig("gw-mem", name, 100)
	}
	h, err := wazerohost.New(wazerohost.Config{Wasm: s.Filter, Workers: 1, PluginConfig: cfg, NodeID: "gw-mem",
		Clusters: map[string][]string{ClusterName: {s.Service.Addr}}, LogLevel: wazerohost.LogWarn})
	if err != nil {
		return m, fmt.Errorf("shared data %s: %w", name, err)
	}
	defer h.Close()
	before := map[string]bool{}
	h.SharedData().Range(func(k string, _ []byte, _ uint32) { before[k] = true })
	bytes0 := h.SharedDataBytes()
	prefix := fmt.Sprintf("mem%d-%s-", time.Now().UnixNano()%1e6, name)
	for i := 0; i < n; i++ {
		resp, err := h.ExchangeWait(context.Background(), 0, BenchRequest(prefix+strconv.Itoa(i)), UpstreamOK)
		if err != nil {
			return m, err
		}
		if resp.Status != 200 {
			return m, fmt.Errorf("shared data %s: status %d", name, resp.Status)
		}
	}
	if synced {
		time.Sleep(600 * time.Millisecond) // a few sync rounds: every bucket has its lease
	}
	var kb, ib, rb int
	h.SharedData().Range(func(k string, v []byte, _ uint32) {
		if before[k] || !strings.HasPrefix(k, "tg:s:") {
			return
		}
		idLen, p := binary.Uvarint(v)
		if p <= 0 || idLen > uint64(len(v)-p) {
			return
		}
		m.Slots++
		if m.SampleKey == "" {
			m.SampleKey = k
		}
		kb += len(k)
		ib += p + int(idLen)
		rec := len(v) - p - int(idLen)
		rb += rec
		m.MaxRecord = max(m.MaxRecord, rec)
	})
	if m.Slots == 0 {
		return m, fmt.Errorf("shared data %s: no new slot keys", name)
	}
	m.KeyBytes = float64(kb) / float64(m.Slots)
	m.IDBytes = float64(ib) / float64(m.Slots)
	m.RecordBytes = float64(rb) / float64(m.Slots)
	m.TotalPerBucket = float64(h.SharedDataBytes()-bytes0) / float64(n)
	m.Evictions = h.Metrics()["tollgate.bucket_evictions"]
	return m, nil
}

// RedisMem is MEMORY USAGE of one bucket after nodes gateways of workers workers each
// have synced it.
type RedisMem struct {
	Algo           string
	Nodes, Workers int
	Bytes          int64 // MEMORY USAGE (key, value and Redis's own overhead)
	Value          int64 // the value's length (STRLEN)
	KeyLen         int   // the key's name
}

// MeasureRedisMemory applies, for each algorithm and fleet shape, what the gateways of
// that fleet send for one bucket (rule "api", 100 per 60 s): each gateway an acquire
// and a report of 3 permits, with the lease it was given, through the store; then it
// reads MEMORY USAGE of the bucket: the algorithm state and the outstanding leases by
// epoch (RATIONALE.md §5), whatever the number of gateways. The workers of a gateway
// share one sync (RATIONALE.md §6), so workers change nothing in Redis; the shape keeps
// them to say so.
func MeasureRedisMemory(ctx context.Context, st *store.Store, shapes [][2]int) ([]RedisMem, error) {
	var out []RedisMem
	run := fmt.Sprintf("m%d", time.Now().UnixNano()%1e9)
	for _, name := range Algorithms {
		k, _ := algo.ParseKind(name)
		for _, shape := range shapes {
			key := fmt.Sprintf("%s-%d-%02dx%d", run, k, shape[0], shape[1]) // one length for every algorithm
			for n := 0; n < shape[0]; n++ {
				node := fmt.Sprintf("%s-gw-%02d", run, n)
				d := wire.Delta{Key: key, Rule: "api", Flags: wire.FlagAcquire, Over: 1, ElapsedMs: 100,
					Algo: uint8(k), Limit: 100, WindowMs: 60_000}
				o, err := st.Apply(ctx, &wire.Batch{Node: node, Seq: 1, Deltas: []wire.Delta{d}}, store.Options{})
				if err != nil {
					return nil, fmt.Errorf("memory %s: %w", name, err)
				}
				got := o.States[0]
				d = wire.Delta{Key: key, Rule: "api", Leased: min(3, got.Lease), Held: got.Lease - min(3, got.Lease), Epoch: got.Epoch,
					ElapsedMs: 1000, Algo: uint8(k), Limit: 100, WindowMs: 60_000}
				if _, err := st.Apply(ctx, &wire.Batch{Node: node, Seq: 2, Deltas: []wire.Delta{d}}, store.Options{Idempotent: true}); err != nil {
					return nil, fmt.Errorf("memory %s: %w", name, err)
				}
			}
			bytes, err := st.MemoryUsage(ctx, key, "api", "", 0)
			if err != nil {
				return nil, fmt.Errorf("MEMORY USAGE %s: %w", name, err)
			}
			bk := store.BucketKey(key, "api", "", 0)
			vlen, err := st.Client().StrLen(ctx, bk).Result()
			if err != nil {
				return nil, fmt.Errorf("STRLEN %s: %w", name, err)
			}
			out = append(out, RedisMem{Algo: name, Nodes: shape[0], Workers: shape[1], Bytes: bytes, Value: vlen, KeyLen: len(bk)})
		}
	}
	return out, nil
}

// RedisRateMemory is MEMORY USAGE of one go-redis/redis_rate key (a string holding the
// theoretical arrival time as a float).
func RedisRateMemory(ctx context.Context, rdb *redis.Client) (int64, error) {
	key := fmt.Sprintf("memrr-%d", time.Now().UnixNano())
	if _, err := redis_rate.NewLimiter(rdb).Allow(ctx, key, redis_rate.PerMinute(100)); err != nil {
		return 0, fmt.Errorf("redis_rate: %w", err)
	}
	return rdb.MemoryUsage(ctx, "rate:"+key, 0).Result()
}

// Package store applies sync batches to Redis: each delta runs the lease script of its
// algorithm (scripts/lease.lua behind one scripts/algo_*.lua fragment, embedded) on the
// bucket's hash, a batch goes out as one pipeline per Redis node, and the results come
// back as the wire States the gateways fold into their leases. It works the same on a
// standalone server, a Redis Cluster and a Sentinel-managed primary through go-redis's
// UniversalClient, and it survives failover by itself: scripts missing on a promoted
// replica (NOSCRIPT) are loaded again and the affected calls retried, a bounded number of
// times.
//
// Everything a batch does is idempotent per (node, worker, seq) (RATIONALE.md §2), so a
// batch that failed on some shards is simply sent again by the gateway.
package store

import (
	"context"
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
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

//go:embed scripts/*.lua
var scriptFS embed.FS

// numKinds is the number of algorithms (algo.FixedWindow is the last).
const numKinds = int(algo.FixedWindow) + 1

// script is one algorithm's full lease script.
type script struct {
	src string
	sha string
}

// buildScripts builds one script per algorithm: the shared helpers (every
// scripts/algo_*.lua not named after an algorithm, in name order), the algorithm's
// fragment (scripts/algo_<name>.lua, with its "-- include: <file>" lines expanded), then
// the lease body. Lua has no include of its own, and token_bucket and gcra share their
// math (scripts/bucket.lua) exactly as shared/algo does.
func buildScripts() ([numKinds]*script, error) {
	var out [numKinds]*script
	body, err := fs.ReadFile(scriptFS, "scripts/lease.lua")
	if err != nil {
		return out, fmt.Errorf("store: lease script: %w", err)
	}
	for k := 0; k < numKinds; k++ {
		frag, err := Fragment(algo.Kind(k))
		if err != nil {
			return out, err
		}
		src := frag + "\n" + string(body)
		sum := sha1.Sum([]byte(src))
		out[k] = &script{src: src, sha: hex.EncodeToString(sum[:])}
	}
	return out, nil
}

// Fragment returns algorithm k's Lua as the scripts run it, shared helpers and includes
// resolved, without the lease body (the differential tests run it on its own).
func Fragment(k algo.Kind) (string, error) {
	names, err := fs.Glob(scriptFS, "scripts/algo_*.lua")
	if err != nil {
		return "", fmt.Errorf("store: algorithm scripts: %w", err)
	}
	sort.Strings(names)
	isKind := map[string]bool{}
	for i := 0; i < numKinds; i++ {
		isKind["scripts/algo_"+algo.Kind(i).String()+".lua"] = true
	}
	var b strings.Builder
	for _, n := range names {
		if isKind[n] {
			continue
		}
		if err := appendScript(&b, n, 0); err != nil {
			return "", err
		}
	}
	name := "scripts/algo_" + k.String() + ".lua"
	if !isKind[name] {
		return "", fmt.Errorf("store: no algorithm %d", k)
	}
	if err := appendScript(&b, name, 0); err != nil {
		return "", fmt.Errorf("store: no script fragment for %s: %w", k, err)
	}
	return b.String(), nil
}

// appendScript writes scripts file name to b, expanding "-- include: <file>" lines
// (bounded depth: includes are for sharing, not recursion).
func appendScript(b *strings.Builder, name string, depth int) error {
	if depth > 2 {
		return fmt.Errorf("store: %s: includes nested too deep", name)
	}
	src, err := fs.ReadFile(scriptFS, name)
	if err != nil {
		return fmt.Errorf("store: %s: %w", name, err)
	}
	for _, line := range strings.SplitAfter(string(src), "\n") {
		if inc, ok := strings.CutPrefix(strings.TrimSpace(line), "-- include: "); ok {
			if err := appendScript(b, "scripts/"+inc, depth+1); err != nil {
				return err
			}
			continue
		}
		b.WriteString(line)
	}
	b.WriteByte('\n')
	return nil
}

// Metrics receives what the store observes; the service implements it with Prometheus.
type Metrics interface {
	// RoundTrip is one pipeline (or other Redis operation) and its outcome.
	RoundTrip(op string, d time.Duration, err error)
	// ScriptReload counts SCRIPT LOADs after NOSCRIPT (failover to a replica that never
	// saw the scripts, or a server restart).
	ScriptReload()
}

type noMetrics struct{}

func (noMetrics) RoundTrip(string, time.Duration, error) {}
func (noMetrics) ScriptReload()                          {}

// Store applies batches. It is safe for concurrent use.
type Store struct {
	rdb     redis.UniversalClient
	cfg     Config
	scripts [numKinds]*script
	metrics Metrics
	fleet   fleet

	// nowUs, when set, replaces Redis TIME in the scripts (tests only: the differential
	// tests drive Redis and the Go twin with one clock).
	nowUs func() int64

	loadMu   sync.Mutex
	loadedAt time.Time
}

// New wraps rdb. It loads the scripts when Redis is reachable; when it is not, the
// first batch loads them. m may be nil.
func New(rdb redis.UniversalClient, cfg Config, m Metrics) (*Store, error) {
	sc, err := buildScripts()
	if err != nil {
		return nil, err
	}
	if m == nil {
		m = noMetrics{}
	}
	s := &Store{rdb: rdb, cfg: cfg.withDefaults(), scripts: sc, metrics: m}
	s.fleet.init()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.AttemptBudget())
	defer cancel()
	_ = s.loadScripts(ctx, time.Time{})
	return s, nil
}

// Open connects with NewClient and returns the Store.
func Open(cfg Config, m Metrics) (*Store, error) {
	rdb, err := NewClient(cfg)
	if err != nil {
		return nil, err
	}
	s, err := New(rdb, cfg, m)
	if err != nil {
		_ = rdb.Close()
		return nil, err
	}
	return s, nil
}

// SetTestClock makes the scripts use now() (µs) instead of Redis TIME. Tests only: it
// lets them drive time (penalty cooldowns, lease expiry) without sleeping, and lets the
// differential tests give Redis and the Go twin the same clock. Call before use.
func (s *Store) SetTestClock(now func() int64) { s.nowUs = now }

// Client is the underlying Redis client (the rules store shares it).
func (s *Store) Client() redis.UniversalClient { return s.rdb }

// Config is the effective configuration (defaults filled in).
func (s *Store) Config() Config { return s.cfg }

// Close waits for background work and closes the Redis client.
func (s *Store) Close() error {
	s.fleet.wg.Wait()
	return s.rdb.Close()
}

// Ping checks that Redis answers (readiness).
func (s *Store) Ping(ctx context.Context) error {
	start := time.Now()
	var err error
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() })
	} else {
		err = s.rdb.Ping(ctx).Err()
	}
	s.metrics.RoundTrip("ping", time.Since(start), err)
	return err
}

// loadScripts loads every script on every node (cluster: primaries and replicas, so a
// promoted replica already has them). Errors from single nodes are returned but the
// others are still loaded. Batches that hit NOSCRIPT together after a failover load
// once: a load that started after since (when the caller's pipeline went out) will do.
func (s *Store) loadScripts(ctx context.Context, since time.Time) error {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	if !since.IsZero() && s.loadedAt.After(since) {
		return nil
	}
	s.loadedAt = time.Now()
	var errs []error
	for _, sc := range s.scripts {
		if err := s.rdb.ScriptLoad(ctx, sc.src).Err(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ErrInvalid is wrapped by batch validation errors (HTTP 400).
var ErrInvalid = errors.New("invalid batch")

// ErrUnavailable is wrapped when some deltas could not be applied (HTTP 503; the
// gateway retries the same batch, which is idempotent).
var ErrUnavailable = errors.New("redis unavailable")

// Validate checks what the decoder cannot: the node id, each delta's key and
// parameters, and that no bucket appears twice (a worker aggregates per bucket; a second
// delta with the same seq would be taken for a replay and lost).
func Validate(b *wire.Batch) error {
	if b.Node == "" {
		return fmt.Errorf("%w: node: empty", ErrInvalid)
	}

	type bucket struct {
		key, rule string
		window    uint8
	}
	seen := make(map[bucket]struct{}, len(b.Deltas))
	for i := range b.Deltas {
		d := &b.Deltas[i]
		if d.Key == "" {
			return fmt.Errorf("%w: delta[%d].key: empty", ErrInvalid, i)
		}
		if d.Rule == "" {
			return fmt.Errorf("%w: delta[%d].rule: empty", ErrInvalid, i)
		}
		if err := lease.ParamsOf(d).Validate(); err != nil {
			return fmt.Errorf("%w: delta[%d] (key %q, rule %q): %w", ErrInvalid, i, d.Key, d.Rule, err)
		}
		k := bucket{d.Key, d.Rule, d.Window}
		if _, dup := seen[k]; dup {
			return fmt.Errorf("%w: delta[%d]: bucket (key %q, rule %q, window %d) appears twice", ErrInvalid, i, d.Key, d.Rule, d.Window)
		}
		seen[k] = struct{}{}
	}
	return nil
}

// Outcome is the result of one batch.
type Outcome struct {
	// States answers Deltas one to one, in order.
	States []wire.State
	// Results are the raw script results, one per delta.
	Results      []lease.SyncResult
	ServerTimeUs int64
	// Nodes is the fleet size (gateways seen syncing within FleetWindow).
	Nodes uint32
	// Failed is how many deltas could not be applied (then Apply's error is
	// ErrUnavailable).
	Failed int
}

// Apply validates b and applies it. Deltas are grouped per algorithm (and, on a
// cluster, per hash slot, since all keys of one script call must share a slot) into
// script calls of at most maxPerCall deltas, and all calls go out as one pipeline, which
// the cluster client splits per node and runs concurrently: one round trip per shard.
// If any delta fails the error wraps ErrUnavailable; the deltas that succeeded are
// applied and a retry of the same batch will not apply them again.
func (s *Store) Apply(ctx context.Context, b *wire.Batch) (*Outcome, error) {
	if err := Validate(b); err != nil {
		return nil, err
	}
	out := &Outcome{
		States:  make([]wire.State, len(b.Deltas)),
		Results: make([]lease.SyncResult, len(b.Deltas)),
	}
	out.Nodes = s.fleet.note(s, b.Node)
	for i := range b.Deltas {
		d := &b.Deltas[i]
		st := &out.States[i]
		st.Key, st.Rule, st.Window = d.Key, d.Rule, d.Window
	}
	if len(b.Deltas) == 0 {
		return out, nil
	}
	_, clustered := s.rdb.(*redis.ClusterClient)
	groups := plan(b, clustered)
	lc := s.cfg.Lease
	now := ""
	if s.nowUs != nil {
		now = strconv.FormatInt(s.nowUs(), 10)
	}
	head := []any{b.Node, strconv.FormatUint(uint64(b.Worker), 10), strconv.FormatUint(b.Seq, 10),
		lc.LeaseTTLUs, lc.HorizonMs, lc.PenaltyBaseUs, lc.PenaltyMaxUs, now}
	calls := make([]call, len(groups))
	for g, grp := range groups {
		keys := make([]string, 0, 2*len(grp.idx))
		args := make([]any, 0, len(head)+1+9*len(grp.idx))
		args = append(append(args, head...), grp.kind)
		for _, i := range grp.idx {
			d := &b.Deltas[i]
			keys = append(keys, BucketKey(d.Key, d.Rule, d.Window), PenaltyKey(d.Key))
			args = append(args, d.Flags, d.Leased, d.Over, d.Returned, d.Rejected, d.Early,
				d.Limit, int64(d.WindowMs)*1000, d.Burst)
		}
		calls[g] = call{sc: s.scripts[grp.kind], keys: keys, args: args}
	}
	errs := s.run(ctx, "sync", calls)
	var firstErr error
	fail := func(n int, err error) {
		out.Failed += n
		if firstErr == nil {
			firstErr = err
		}
	}
	for g, grp := range groups {
		if errs[g] != nil {
			fail(len(grp.idx), errs[g])
			continue
		}
		nowUs, err := parseResults(calls[g].res, grp.idx, out.Results)
		if err != nil {
			fail(len(grp.idx), err)
			continue
		}
		out.ServerTimeUs = max(out.ServerTimeUs, nowUs)
		for _, i := range grp.idx {
			out.Results[i].Fill(&out.States[i])
		}
	}
	if out.Failed > 0 {
		return out, fmt.Errorf("%w: %d of %d deltas failed: %w", ErrUnavailable, out.Failed, len(b.Deltas), firstErr)
	}
	return out, nil
}

// maxPerCall bounds the deltas of one script call: enough to amortize the call, few
// enough that one call blocks Redis for about a millisecond at most.
const maxPerCall = 100

// group is the deltas (indexes into the batch, in batch order) of one script call.
type group struct {
	kind int
	idx  []int
}

// plan groups a batch's deltas per algorithm, and per hash slot when clustered, in
// order of first appearance, and cuts groups into calls of at most maxPerCall. The
// deltas of one caller key are therefore applied in batch order within an algorithm,
// and algorithm group by algorithm group (the Go twin in the tests follows the same
// order).
func plan(b *wire.Batch, clustered bool) []group {
	type gk struct{ kind, slot int }
	open := map[gk]int{} // group key -> index of its open (not yet full) group
	var groups []group
	for i := range b.Deltas {
		d := &b.Deltas[i]
		k := gk{kind: int(d.Algo)}
		if clustered {
			k.slot = Slot(KeyPrefix(d.Key))
		}
		g, ok := open[k]
		if !ok || len(groups[g].idx) == maxPerCall {
			groups = append(groups, group{kind: int(d.Algo)})
			g = len(groups) - 1
			open[k] = g
		}
		groups[g].idx = append(groups[g].idx, i)
	}
	return groups
}

// call is one script invocation of a batch.
type call struct {
	sc   *script
	keys []string
	args []any
	res  any
}

// maxAttempts bounds the NOSCRIPT recovery: EVALSHA, reload and EVALSHA again, then
// EVAL with the full source (which cannot hit NOSCRIPT).
const maxAttempts = 3

// run executes calls in one pipeline and returns one error per call. Calls that hit
// NOSCRIPT are retried after loading the scripts everywhere; every other error is final
// for this batch (the gateway retries the batch).
func (s *Store) run(ctx context.Context, op string, calls []call) []error {
	errs := make([]error, len(calls))
	pending := make([]int, len(calls))
	for i := range pending {
		pending[i] = i
	}
	for attempt := 0; attempt < maxAttempts && len(pending) > 0; attempt++ {
		eval := attempt == maxAttempts-1
		pipe := s.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(pending))
		for j, i := range pending {
			c := &calls[i]
			if eval {
				cmds[j] = pipe.Eval(ctx, c.sc.src, c.keys, c.args...)
			} else {
				cmds[j] = pipe.EvalSha(ctx, c.sc.sha, c.keys, c.args...)
			}
		}
		start := time.Now()
		_, err := pipe.Exec(ctx)
		s.metrics.RoundTrip(op, time.Since(start), err)
		var retry []int
		reload := false
		for j, i := range pending {
			res, err := cmds[j].Result()
			if err != nil && !isRedisError(err) {
				reload = true
			}
			if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") && !eval {
				retry = append(retry, i)
				continue
			}
			calls[i].res, errs[i] = res, err
		}
		if cc, ok := s.rdb.(*redis.ClusterClient); ok && reload {
			// go-redis reloads the slot map by itself on MOVED, not when a pipeline
			// cannot reach a dead primary; ask for it so the promoted replica is found.
			cc.ReloadState(ctx)
		}
		if len(retry) > 0 {
			s.metrics.ScriptReload()
			lctx, cancel := context.WithTimeout(ctx, s.cfg.AttemptBudget())
			_ = s.loadScripts(lctx, start) // a node that is down fails again below, with its own error
			cancel()
		}
		pending = retry
	}
	for _, i := range pending {
		errs[i] = fmt.Errorf("script still missing after %d attempts", maxAttempts)
	}
	return errs
}

// isRedisError reports an error answered by a server (as opposed to a network or
// context error).
func isRedisError(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
}

// parseResults checks the script's reply shape (lease.lua's return array) and stores
// the results of the deltas idx into res. It returns the server time of the call.
func parseResults(v any, idx []int, res []lease.SyncResult) (int64, error) {
	arr, ok := v.([]any)
	if !ok || len(arr) != 1+resultFields*len(idx) {
		return 0, fmt.Errorf("unexpected script reply for %d deltas: %T of length %d", len(idx), v, len(arr))
	}
	n := make([]int64, len(arr))
	for i, x := range arr {
		iv, ok := x.(int64)
		if !ok {
			return 0, fmt.Errorf("script reply[%d]: %T %v is not an integer", i, x, x)
		}
		n[i] = iv
	}
	for j, i := range idx {
		r := n[1+resultFields*j:]
		res[i] = lease.SyncResult{
			Replay: r[0] == 1, Allowed: r[1] == 1, Remaining: r[2], Grant: r[3], Held: r[4],
			ResetUs: r[5], RetryUs: r[6], PenaltyUs: r[7], Level: r[8], Overshoot: r[9], Reclaimed: r[10],
		}
	}
	return n[0], nil
}

// resultFields is the number of reply values per delta.
const resultFields = 11

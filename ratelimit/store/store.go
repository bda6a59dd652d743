// Package store applies sync batches to Redis: every delta runs the lease script
// (scripts/lease.lua behind the scripts/algo_*.lua fragments, embedded) on its bucket, the
// deltas a batch has on one Redis node go out as script calls of up to 100 in one
// pipeline, and the results come back as the wire States the gateways fold into their
// leases. It works the same on a standalone server, a Redis Cluster and a
// Sentinel-managed primary through go-redis's UniversalClient, and it survives failover
// by itself: scripts missing on a promoted replica (NOSCRIPT) are loaded again and the
// affected calls retried, a bounded number of times.
//
// A batch is applied exactly once per (gateway, seq): each script call records its seq
// and results in the gateway's idempotency hash on that Redis node, and a replayed
// batch is answered from there (RATIONALE.md §2), so a batch that failed on some nodes
// is simply sent again by the gateway.
package store

import (
	"context"
	"crypto/sha1"
	"embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/internal/backend"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

//go:embed scripts/*.lua
var scriptFS embed.FS

// numKinds is the number of algorithms.
const numKinds = algo.NumKinds

// script is the lease script.
type script struct {
	src string
	sha string
}

// buildScript assembles the one lease script: the shared helpers, every algorithm's
// fragment in a closure of its own registered as ALGOS[kind] (each fragment defines the
// same six function names), then the lease body. Lua has no include of its own.
//
// The script is flagged allow-cross-slot-keys (Redis 7): on a cluster one call carries
// the deltas of every slot its node serves, with the gateway's idempotency record for
// that node, instead of one call per slot.
func buildScript() (*script, error) {
	body, err := fs.ReadFile(scriptFS, "scripts/lease.lua")
	if err != nil {
		return nil, fmt.Errorf("store: lease script: %w", err)
	}
	helpers, err := helperSource()
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	b.WriteString("#!lua flags=allow-cross-slot-keys\n")
	b.WriteString(helpers)
	// Each algorithm is built on first use in a call: building all five on every call
	// cost more Redis CPU than a one-delta acquire itself.
	b.WriteString("local MAKE = {}\n")
	for k := 0; k < numKinds; k++ {
		frag, err := fragmentSource(algo.Kind(k))
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, "MAKE[%d] = function()\n%s\nreturn {available = algo_available, take = algo_take, refund = algo_refund, "+
			"decide = algo_decide, reset_at = algo_reset_at, retry_after = algo_retry_after}\nend\n", k, frag)
	}
	b.WriteString("local ALGOS = setmetatable({}, {__index = function(t, k)\n" +
		"  local mk = MAKE[k]\n  if not mk then return nil end\n  local a = mk()\n  rawset(t, k, a)\n  return a\nend})\n")
	b.Write(body)
	src := b.String()
	sum := sha1.Sum([]byte(src))
	return &script{src: src, sha: hex.EncodeToString(sum[:])}, nil
}

// Fragment returns algorithm k's Lua as the script runs it, shared helpers and includes
// resolved, without the lease body (the differential tests run it on its own).
func Fragment(k algo.Kind) (string, error) {
	helpers, err := helperSource()
	if err != nil {
		return "", err
	}
	frag, err := fragmentSource(k)
	if err != nil {
		return "", err
	}
	return helpers + frag, nil
}

func isKindFile(name string) bool {
	for i := 0; i < numKinds; i++ {
		if name == "scripts/algo_"+algo.Kind(i).String()+".lua" {
			return true
		}
	}
	return false
}

// helperSource is every scripts/algo_*.lua not named after an algorithm, in name order.
func helperSource() (string, error) {
	names, err := fs.Glob(scriptFS, "scripts/algo_*.lua")
	if err != nil {
		return "", fmt.Errorf("store: algorithm scripts: %w", err)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		if isKindFile(n) {
			continue
		}
		if err := appendScript(&b, n, 0); err != nil {
			return "", err
		}
	}
	return b.String(), nil
}

func fragmentSource(k algo.Kind) (string, error) {
	name := "scripts/algo_" + k.String() + ".lua"
	if !isKindFile(name) {
		return "", fmt.Errorf("store: no algorithm %d", k)
	}
	var b strings.Builder
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
	script  *script
	metrics Metrics
	fleet   fleet
	slots   slotMap
	pipes   coalescer
	params  paramsSeen

	// nowUs, when set, replaces Redis TIME in the scripts (tests only: the differential
	// tests drive Redis and the Go twin with one clock).
	nowUs func() int64
	// fleetNowUs, when set, replaces the service's clock in the fleet count (tests only:
	// the conformance suite drives the probation and the window on its clock; tests that
	// share a Redis with others keep the wall clock, or their gateways would count in
	// each other's fleets).
	fleetNowUs func() int64
	// nodes, when set, replaces the fleet size the scripts size first leases by (tests
	// only: the differential test's gateways sync too briefly to be counted).
	nodes func() uint32

	loadMu   sync.Mutex
	loadedAt time.Time
}

// New wraps rdb. It loads the script when Redis is reachable; when it is not, the
// first batch loads it. m may be nil.
func New(rdb redis.UniversalClient, cfg Config, m Metrics) (*Store, error) {
	sc, err := buildScript()
	if err != nil {
		return nil, err
	}
	if m == nil {
		m = noMetrics{}
	}
	s := &Store{rdb: rdb, cfg: cfg.withDefaults(), script: sc, metrics: m}
	if err := s.fleet.init(); err != nil {
		return nil, err
	}
	s.params.init()
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

// SetTestClock makes the scripts and Usage use now() (µs) instead of Redis TIME. Tests only: it
// lets them drive time (penalty cooldowns, lease epochs) without sleeping, and lets the
// differential tests give Redis and the Go twin the same clock. Keys still expire on
// Redis's own clock. Call before use.
func (s *Store) SetTestClock(now func() int64) { s.nowUs = now }

// clock is the fleet count's time (which gateways synced when): the service's clock, or
// fleetNowUs in tests.
func (s *Store) clock() time.Time {
	if s.fleetNowUs != nil {
		return time.UnixMicro(s.fleetNowUs())
	}
	return time.Now()
}

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

// loadScripts loads the script on every node (cluster: primaries and replicas, so a
// promoted replica already has it). Batches that hit NOSCRIPT together after a failover
// load once: a load that started after since (when the caller's pipeline went out)
// will do.
func (s *Store) loadScripts(ctx context.Context, since time.Time) error {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	if !since.IsZero() && s.loadedAt.After(since) {
		return nil
	}
	s.loadedAt = time.Now()
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		return cc.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.ScriptLoad(ctx, s.script.src).Err()
		})
	}
	return s.rdb.ScriptLoad(ctx, s.script.src).Err()
}

// The batch contract's names, kept here for the store's callers (the service, the RLS
// front end, the benchmarks): Apply is the store's half of internal/backend.Backend.
type (
	Options    = backend.Options
	Outcome    = backend.Outcome
	ShardError = backend.ShardError
)

var (
	ErrInvalid     = backend.ErrInvalid
	ErrUnavailable = backend.ErrUnavailable
)

// The store is the product's backend; internal/backendtest holds it to the contract.
var _ backend.Backend = (*Store)(nil)

// storeKeys returns the form of every delta's caller key in Redis (b's own keys when
// o.StoreKey is unset).
func storeKeys(o *Options, b *wire.Batch) []string {
	keys := make([]string, len(b.Deltas))
	for i := range b.Deltas {
		keys[i] = b.Deltas[i].Key
		if o.StoreKey != nil {
			keys[i] = o.StoreKey(keys[i])
		}
	}
	return keys
}

// Apply applies b. Deltas are grouped per Redis node that serves their keys (one group
// on a standalone server) into script calls of at most maxPerCall deltas, and all calls
// go out as one pipeline, which the cluster client splits per node and runs
// concurrently: one round trip per node. A batch without idempotency records (a check
// or an acquire) shares its pipelines with the checks in flight at the same time, per
// node (coalescer). If any call fails the error wraps
// ErrUnavailable; the calls that succeeded are applied and a retry of the same batch
// (Idempotent) will not apply them again.
func (s *Store) Apply(ctx context.Context, b *wire.Batch, o Options) (*Outcome, error) {
	if b.Node == "" {
		return nil, fmt.Errorf("%w: node: empty", ErrInvalid)
	}
	out, ok := backend.Screen(b, &o)
	out.Nodes = s.fleet.note(s, b.Node)
	skeys := storeKeys(&o, b)
	groups, err := s.plan(ctx, b, skeys, ok)
	if err != nil {
		return out, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if len(groups) == 0 {
		return out, nil
	}
	lc := s.cfg.Lease
	// The fleet size sizes a gateway's first lease of a bucket (lease.SyncConfig.Nodes).
	fleetSize := out.Nodes
	if s.nodes != nil {
		fleetSize = s.nodes()
	}
	nodes := lease.SyncConfig{Nodes: int64(fleetSize)}.Normalized().Nodes
	now := ""
	if s.nowUs != nil {
		now = strconv.FormatInt(s.nowUs(), 10)
	}
	seq := strconv.FormatUint(b.Seq, 10)
	tag := lease.NodeTag(b.Node) // whose early claims these are (penalties)
	calls := make([]call, len(groups))
	for g, grp := range groups {
		var keys []string
		field := ""
		if o.Idempotent {
			field = strconv.Itoa(grp.chunk)
			keys = []string{idemKey(grp.slot, b.Node)}
		} else {
			d := &b.Deltas[grp.idx[0]]
			keys = []string{BucketKey(skeys[grp.idx[0]], d.Rule, d.Tier, d.Window)}
		}
		args := make([]any, 0, callHeaderArgs+argsPerDelta*len(grp.idx))
		args = append(args, field, seq, s.cfg.IdempotencyTTL.Milliseconds(), lc.EpochMs, lc.HorizonMs, lc.MaxShare,
			lc.RenewMs, lc.MinElapsedMs, lc.ValidMarginMs, lc.PenaltyBaseUs, lc.PenaltyMaxUs, now, nodes)
		for _, i := range grp.idx {
			d := &b.Deltas[i]
			flags := d.Flags
			if o.NoLease {
				flags |= lease.FlagNoLease
			}
			args = append(args, BucketKey(skeys[i], d.Rule, d.Tier, d.Window), PenaltyKey(skeys[i]), packDelta(d, flags, tag),
				NodeLeaseKey(skeys[i], d.Rule, d.Tier, d.Window, tag))
		}
		calls[g] = call{keys: keys, args: args}
	}
	errs := s.send(ctx, b, o, groups, calls)
	var firstErr error
	for g, grp := range groups {
		err := errs[g]
		var nowUs int64
		if err == nil {
			nowUs, err = parseResults(calls[g].res, grp.idx, out.Results)
		}
		if err != nil {
			out.Failed += len(grp.idx)
			out.ShardErrors = append(out.ShardErrors, ShardError{Slot: grp.slot, Deltas: len(grp.idx), Err: err})
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		out.ServerTimeUs = max(out.ServerTimeUs, nowUs)
		for _, i := range grp.idx {
			st := &out.States[i]
			out.Results[i].RateAnswer = b.Deltas[i].Flags&wire.FlagRate != 0
			out.Results[i].Fill(st)
		}
	}
	if out.Failed > 0 {
		return out, fmt.Errorf("%w: %d of %d deltas failed: %w", ErrUnavailable, out.Failed, len(b.Deltas), firstErr)
	}
	if !o.NoLearn {
		s.params.note(ctx, s, b, ok)
	}
	return out, nil
}

// maxPerCall bounds the deltas of one script call (backend.MaxPerCall says why).
const maxPerCall = backend.MaxPerCall

// group is the deltas (indexes into the batch, in batch order) of one script call: all
// served by one Redis node. slot is a slot of that node (where the gateway's
// idempotency record for it lives) and chunk numbers the calls to that node.
type group struct {
	addr  string // the node ("" on a standalone server)
	slot  int
	chunk int
	idx   []int
}

// plan groups the accepted deltas per Redis node, in order of first appearance, and
// cuts each node's deltas into calls of at most maxPerCall. The grouping depends only on
// the batch and the cluster's slot map, so a resent batch is cut the same way and each
// call finds its own idempotency record.
func (s *Store) plan(ctx context.Context, b *wire.Batch, skeys []string, ok []bool) ([]group, error) {
	type node struct {
		slot, calls int
		open        int // index of its open (not yet full) group, -1 for none
	}
	var nodes map[string]*node
	var groups []group
	cc, clustered := s.rdb.(*redis.ClusterClient)
	var sm *slotTable
	if clustered {
		var err error
		if sm, err = s.slots.get(ctx, cc); err != nil {
			return nil, err
		}
	}
	nodes = map[string]*node{}
	for i := range b.Deltas {
		if !ok[i] {
			continue
		}
		addr, slot := "", 0
		if clustered {
			addr, slot = sm.owner(Slot(KeyPrefix(skeys[i])))
		}
		n := nodes[addr]
		if n == nil {
			n = &node{slot: slot, open: -1}
			nodes[addr] = n
		}
		if n.open < 0 || len(groups[n.open].idx) == maxPerCall {
			groups = append(groups, group{addr: addr, slot: n.slot, chunk: n.calls})
			n.calls++
			n.open = len(groups) - 1
		}
		groups[n.open].idx = append(groups[n.open].idx, i)
	}
	return groups, nil
}

// send runs a batch's calls and returns one error per call. A sync batch (Idempotent)
// goes out as one pipeline of its own: a gateway's batch already carries all its
// buckets. Checks and acquires, one request each, join the pipelines of concurrent
// checks per node (coalescer): one round trip carries many.
func (s *Store) send(ctx context.Context, b *wire.Batch, o Options, groups []group, calls []call) []error {
	if o.Idempotent {
		return s.run(ctx, "sync", calls)
	}
	run := s.runMerged
	first := groups[0].addr
	single := true
	for _, g := range groups[1:] {
		if g.addr != first {
			single = false
			break
		}
	}
	if single {
		return s.pipes.do(ctx, first, calls, run)
	}
	// Calls for several nodes: one share per node, sent concurrently (as the cluster
	// client sends one pipeline's commands per node).
	byNode := map[string][]int{}
	var order []string
	for i, g := range groups {
		if _, ok := byNode[g.addr]; !ok {
			order = append(order, g.addr)
		}
		byNode[g.addr] = append(byNode[g.addr], i)
	}
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	for _, addr := range order {
		idx := byNode[addr]
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([]call, len(idx))
			for j, i := range idx {
				mine[j] = calls[i]
			}
			e := s.pipes.do(ctx, addr, mine, run)
			for j, i := range idx {
				calls[i].res, errs[i] = mine[j].res, e[j]
			}
		}()
	}
	wg.Wait()
	return errs
}

// runMerged runs the script calls of checks and acquires bound for one node (gathered
// by the coalescer) as few script invocations as fit maxPerCall deltas each, in their
// order, and hands each call its share of the results. A call of the lease script costs
// Redis about as much again as the deltas it carries (the script's set-up and its
// garbage: 60-80 µs of Redis CPU for a one-delta acquire, 17-20 µs a delta in a call of
// a hundred, BenchmarkLuaPerDelta), so acquires that arrive together cost a share of one
// call. The deltas are applied one after the other at one server time, as separate calls
// at the same instant would be; nothing they decide changes. Checks carry no
// idempotency record, so the calls differ only in their deltas.
func (s *Store) runMerged(ctx context.Context, calls []call) []error {
	if len(calls) <= 1 {
		return s.run(ctx, "sync", calls)
	}
	var merged []call
	var members [][]int
	size := 0 // deltas in the last merged call
	for i := range calls {
		c := &calls[i]
		n := (len(c.args) - callHeaderArgs) / argsPerDelta
		if len(merged) == 0 || size+n > maxPerCall {
			merged = append(merged, call{keys: c.keys, args: append([]any(nil), c.args...)})
			members = append(members, []int{i})
			size = n
			continue
		}
		m := len(merged) - 1
		merged[m].args = append(merged[m].args, c.args[callHeaderArgs:]...)
		members[m] = append(members[m], i)
		size += n
	}
	errs := s.run(ctx, "sync", merged)
	out := make([]error, len(calls))
	for m, idx := range members {
		if errs[m] != nil {
			for _, i := range idx {
				out[i] = errs[m]
			}
			continue
		}
		arr, ok := merged[m].res.([]any)
		var blob string
		if ok && len(arr) == 2 {
			blob, ok = arr[1].(string)
		}
		off := 0
		for _, i := range idx {
			n := (len(calls[i].args) - callHeaderArgs) / argsPerDelta
			end := off + 8*resultFields*n
			if !ok || end > len(blob) {
				calls[i].res = merged[m].res // parseResults names the bad shape
				continue
			}
			calls[i].res = []any{arr[0], blob[off:end]}
			off = end
		}
	}
	return out
}

// callHeaderArgs is the number of script arguments before the first delta's, and
// argsPerDelta the number per delta (lease.lua's ARGV).
const (
	callHeaderArgs = 13
	argsPerDelta   = 4
)

// call is one script invocation of a batch.
type call struct {
	keys []string
	args []any
	res  any
}

// maxAttempts bounds the NOSCRIPT recovery: EVALSHA, reload and EVALSHA again, then
// EVAL with the full source (which cannot hit NOSCRIPT).
const maxAttempts = 3

// run executes calls in one pipeline and returns one error per call. Calls that hit
// NOSCRIPT are retried after loading the script everywhere; every other error is final
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
				cmds[j] = pipe.Eval(ctx, s.script.src, c.keys, c.args...)
			} else {
				cmds[j] = pipe.EvalSha(ctx, s.script.sha, c.keys, c.args...)
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
			if err != nil && (redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "CROSSSLOT")) {
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
			// cannot reach a dead primary; ask for it so the promoted replica is found,
			// and drop the store's own copy.
			cc.ReloadState(ctx)
			s.slots.invalidate()
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

// packDelta encodes a delta's numbers as the script's DELTA format: kind and flags
// (u8), leased, over, returned, held, rejected, early, epoch, elapsed_ms, limit (u32),
// window_us (float64, exact below 2^53), burst, capacity, want, rate, rate_used,
// rate_epoch, rate_stock and the node's tag (u32, lease.NodeTag), little-endian.
func packDelta(d *wire.Delta, flags uint8, tag uint32) string {
	p := lease.ParamsOf(d)
	b := make([]byte, 0, deltaSize)
	b = append(b, d.Algo, flags)
	for _, v := range [...]uint32{d.Leased, d.Over, d.Returned, d.Held, d.Rejected, d.Early, d.Epoch, d.ElapsedMs, d.Limit} {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(float64(p.WindowUs)))
	b = binary.LittleEndian.AppendUint32(b, d.Burst)
	b = binary.LittleEndian.AppendUint32(b, uint32(min(max(p.Capacity(), 0), math.MaxUint32)))
	b = binary.LittleEndian.AppendUint32(b, d.Want)
	b = binary.LittleEndian.AppendUint32(b, d.Rate)
	b = binary.LittleEndian.AppendUint32(b, d.RateUsed)
	b = binary.LittleEndian.AppendUint32(b, d.RateEpoch)
	b = binary.LittleEndian.AppendUint32(b, d.RateStock)
	b = binary.LittleEndian.AppendUint32(b, tag)
	return string(b)
}

// deltaSize is the length of packDelta's encoding.
const deltaSize = 2 + 9*4 + 8 + 8*4

// resultFields is the number of reply values per delta, each a little-endian float64
// (the script's RESULT format).
const resultFields = 18

// parseResults checks the script's reply shape (lease.lua's {now, results}) and stores
// the results of the deltas idx into res. It returns the server time of the call.
func parseResults(v any, idx []int, res []lease.SyncResult) (int64, error) {
	arr, ok := v.([]any)
	if !ok || len(arr) != 2 {
		return 0, fmt.Errorf("unexpected script reply for %d deltas: %T", len(idx), v)
	}
	now, ok1 := arr[0].(int64)
	blob, ok2 := arr[1].(string)
	if !ok1 || !ok2 || len(blob) != 8*resultFields*len(idx) {
		return 0, fmt.Errorf("unexpected script reply for %d deltas: %T, %T of length %d", len(idx), arr[0], arr[1], len(blob))
	}
	b := []byte(blob)
	var r [resultFields]int64
	for j, i := range idx {
		for k := range r {
			f := math.Float64frombits(binary.LittleEndian.Uint64(b[8*(resultFields*j+k):]))
			if f != math.Trunc(f) || math.Abs(f) > 1<<53 {
				return 0, fmt.Errorf("script reply for delta %d, field %d: %v is not an exact integer", j, k, f)
			}
			r[k] = int64(f)
		}
		res[i] = lease.SyncResult{
			Replay: r[0] == 1, Allowed: r[1] == 1, Remaining: r[2], Grant: r[3], Held: r[4],
			Epoch: uint32(r[5]), ValidUs: r[6], LowWater: r[7], ResetUs: r[8], RetryUs: r[9],
			PenaltyUs: r[10], Level: r[11], Overshoot: r[12], Reclaimed: r[13], Clamped: r[14], Excess: r[15], Rate: r[16], Stock: r[17], NowUs: now,
		}
	}
	return now, nil
}

// Package backendtest is the one conformance suite of internal/backend.Backend, run
// against every backend (as wazero's internal/testing/enginetest is run against every
// engine): the Redis store (ratelimit/store, on a server and a cluster) and the in-memory
// service (internal/memservice) must answer the same batches the same way, and Compare
// runs both in lockstep, answer for answer. The store is the product; where the two
// differed, the in-memory one was fixed. It lives under internal/ so that memservice's
// tests can run it without importing ratelimit/.
//
// Time: every case drives one virtual server clock (Clock). A backend reads it for
// every batch — the memory service as its now; the store's scripts read it instead of
// Redis TIME (SetTestClock) and its fleet count instead of the wall clock (on a Redis of
// its own: the fleet set is global). So both are judged at the same instants, to the
// microsecond. What only a real clock
// decides is left out: Redis expires keys (buckets, penalty and lease records, the
// idempotency hash) on its own clock, so no case depends on a key expiring — the cases
// that span long virtual times check what the lease logic decides from the stored
// times (cooldowns ending, penalties decaying, leases reclaimed after two epochs),
// which is what the TTLs are chosen never to change.
package backendtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/backend"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// T0 is where every case's clock starts: the first microsecond of a minute, so the
// suite's fixed windows of a minute do not roll over within a case.
const T0 = int64(1_700_000_040_000_000)

// Clock is the server time of a case (µs). Safe for concurrent use: the store reads it
// from its background fleet refresh too.
type Clock struct{ us atomic.Int64 }

// Now is the current server time (µs).
func (c *Clock) Now() int64 { return c.us.Load() }

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) { c.us.Add(d.Microseconds()) }

// Lease is the lease configuration every backend under test is built with: short
// epochs and cooldowns, so the cases reach epoch ends and penalty decay in a few
// virtual seconds.
var Lease = lease.SyncConfig{EpochMs: 2000, HorizonMs: 1000, MaxShare: 2, RenewMs: 200, MinElapsedMs: 100,
	ValidMarginMs: 100, PenaltyBaseUs: 1_000_000, PenaltyMaxUs: 8_000_000}

// Setup is what newBackend builds a backend with.
type Setup struct {
	// Clock is the server time the backend must read for every batch.
	Clock *Clock
	// Lease is the lease configuration (the package's Lease). The fleet count and the
	// idempotency records keep the backend defaults (backend.DefaultFleet*,
	// backend.DefaultIdempotencyTTL).
	Lease lease.SyncConfig
}

// NewBackend builds a backend for one case. It must hold no state yet (no buckets,
// penalties, idempotency records or fleet members).
type NewBackend func(t *testing.T, s Setup) backend.Backend

// Run runs every case on a backend of its own from newBackend.
func Run(t *testing.T, newBackend NewBackend) { run(t, newBackend, nil) }

// Compare runs every case on a backend from newBackend, as Run does, and sends every
// batch to one from twin at the same instant too: twin must answer each exactly as the
// first does (every state, result and server time; the fleet size on batches with
// deltas), so the two agree beyond what the cases assert. newBackend is the reference.
func Compare(t *testing.T, newBackend, twin NewBackend) { run(t, newBackend, twin) }

func run(t *testing.T, newBackend, twin NewBackend) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := &Clock{}
			clock.us.Store(T0)
			e := &env{t: t, be: newBackend(t, Setup{Clock: clock, Lease: Lease}), clock: clock}
			if twin != nil {
				e.twin = twin(t, Setup{Clock: clock, Lease: Lease})
			}
			c.run(t, e)
		})
	}
}

type env struct {
	t     *testing.T
	be    backend.Backend
	twin  backend.Backend // Compare's second backend, or nil
	clock *Clock
	seq   map[string]uint64
}

// compare checks that the twin answers b as the reference did (out, err).
func (e *env) compare(b *wire.Batch, o backend.Options, out *backend.Outcome, err error) {
	e.t.Helper()
	cp := *b
	cp.Deltas = slices.Clone(b.Deltas)
	tout, terr := e.twin.Apply(context.Background(), &cp, o)
	if (err == nil) != (terr == nil) {
		e.t.Fatalf("node %q seq %d: reference error %v, twin error %v", b.Node, b.Seq, err, terr)
	}
	if err != nil {
		return
	}
	if out.ServerTimeUs != tout.ServerTimeUs || out.Refused != tout.Refused || out.Failed != tout.Failed ||
		(len(b.Deltas) > 0 && out.Nodes != tout.Nodes) {
		e.t.Fatalf("node %q seq %d: reference server time %d, refused %d, failed %d, fleet %d; twin %d, %d, %d, %d",
			b.Node, b.Seq, out.ServerTimeUs, out.Refused, out.Failed, out.Nodes, tout.ServerTimeUs, tout.Refused, tout.Failed, tout.Nodes)
	}
	for i := range out.States {
		if out.States[i] != tout.States[i] || out.Results[i] != tout.Results[i] {
			e.t.Fatalf("node %q seq %d, delta %d:\nreference %+v\n          %+v\ntwin      %+v\n          %+v",
				b.Node, b.Seq, i, out.States[i], out.Results[i], tout.States[i], tout.Results[i])
		}
	}
}

var cases = []struct {
	name string
	run  func(t *testing.T, e *env)
}{
	{"refusals", testRefusals},
	{"node_empty", testNodeEmpty},
	{"heartbeat", testHeartbeat},
	{"replay", testReplay},
	{"chunks", testChunks},
	{"check_not_recorded", testCheck},
	{"store_key", testStoreKey},
	{"lease_grant_renew_release", testLeaseLifecycle},
	{"no_lease", testNoLease},
	{"penalty", testPenalty},
	{"fleet", testFleet},
	{"node_records", testNodeRecords},
}

// apply sends b and fails the test on an error.
func (e *env) apply(b *wire.Batch, o backend.Options) *backend.Outcome {
	e.t.Helper()
	out, err := e.be.Apply(context.Background(), b, o)
	if e.twin != nil {
		e.compare(b, o, out, err)
	}
	if err != nil {
		e.t.Fatalf("Apply(node %q, seq %d, %d deltas): %v", b.Node, b.Seq, len(b.Deltas), err)
	}
	if len(out.States) != len(b.Deltas) {
		e.t.Fatalf("%d states for %d deltas", len(out.States), len(b.Deltas))
	}
	return out
}

// sync sends deltas as node's next sync batch (idempotent).
func (e *env) sync(node string, ds ...wire.Delta) *backend.Outcome {
	e.t.Helper()
	if e.seq == nil {
		e.seq = map[string]uint64{}
	}
	e.seq[node]++
	return e.apply(&wire.Batch{Node: node, Seq: e.seq[node], Deltas: ds}, backend.Options{Idempotent: true})
}

// read is what node's strict check of nothing answers for d's bucket: what it holds
// beyond every lease, charged nothing.
func (e *env) read(node string, d wire.Delta) wire.State {
	e.t.Helper()
	r := wire.Delta{Key: d.Key, Rule: d.Rule, Tier: d.Tier, Window: d.Window, Algo: d.Algo, Limit: d.Limit,
		WindowMs: d.WindowMs, Burst: d.Burst, Flags: wire.FlagStrict}
	out := e.apply(&wire.Batch{Node: node, Seq: 1, Deltas: []wire.Delta{r}}, backend.Options{})
	return out.States[0]
}

// fixed is a delta on key's bucket of a fixed window of limit per minute, reporting
// nothing yet.
func fixed(key string, limit uint32) wire.Delta {
	return wire.Delta{Key: key, Rule: "api", Algo: uint8(algo.FixedWindow), Limit: limit, WindowMs: 60_000}
}

// testRefusals: each delta no backend may apply is answered StateRefused with its
// reason, charged nothing, and the rest of its batch is applied as if it were alone.
func testRefusals(t *testing.T, e *env) {
	long := strings.Repeat("x", 100)
	tests := []struct {
		name   string
		bad    func(good wire.Delta) wire.Delta
		refuse func(*wire.Delta) string
		want   string // the reason, or its prefix when it ends with "*"
	}{
		{"empty key", func(d wire.Delta) wire.Delta { d.Key = ""; return d }, nil, "key: empty"},
		{"empty rule", func(d wire.Delta) wire.Delta { d.Rule = ""; return d }, nil, "rule: empty"},
		{"limit 0", func(d wire.Delta) wire.Delta { d.Rule, d.Limit = "other", 0; return d }, nil, "params: limit: must be in [1, *"},
		{"unknown algorithm", func(d wire.Delta) wire.Delta { d.Rule, d.Algo = "other", 9; return d }, nil, "params: algorithm: unknown algorithm 9*"},
		{"window 0", func(d wire.Delta) wire.Delta { d.Rule, d.WindowMs = "other", 0; return d }, nil, "params: window: must be in [1000, *"},
		{"more than a permit per µs", func(d wire.Delta) wire.Delta { d.Rule, d.Limit, d.WindowMs = "other", 1001, 1; return d }, nil, "params: *"},
		{"bucket twice in the batch", func(d wire.Delta) wire.Delta { return d }, nil, "bucket appears twice in the batch"},
		{"Options.Refuse", func(d wire.Delta) wire.Delta { d.Rule = "banned"; return d },
			func(d *wire.Delta) string {
				if d.Rule == "banned" {
					return `unknown rule "banned"`
				}
				return ""
			}, `unknown rule "banned"`},
		{"Options.Refuse, cut to the wire's length", func(d wire.Delta) wire.Delta { d.Rule = "banned"; return d },
			func(d *wire.Delta) string {
				if d.Rule == "banned" {
					return long
				}
				return ""
			}, long[:wire.MaxTagLen]},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			good := fixed(fmt.Sprint("refusal-", i), 100)
			good.Over = 5
			bad := tc.bad(good)
			bad.Over = 7
			b := &wire.Batch{Node: "gw-1", Seq: uint64(i + 1), Deltas: []wire.Delta{good, bad}}
			out := e.apply(b, backend.Options{Idempotent: true, Refuse: tc.refuse})
			st := out.States[1]
			want, prefix := strings.CutSuffix(tc.want, "*")
			if st.Flags != wire.StateRefused || (prefix && !strings.HasPrefix(st.Reason, want)) || (!prefix && st.Reason != want) {
				t.Fatalf("bad delta: flags %b reason %q, want refused with %q", st.Flags, st.Reason, tc.want)
			}
			if st.Key != bad.Key || st.Rule != bad.Rule || st.Window != bad.Window {
				t.Fatalf("refused state names %q/%q/%d, want the delta's %q/%q/%d", st.Key, st.Rule, st.Window, bad.Key, bad.Rule, bad.Window)
			}
			if out.Refused != 1 || out.Results[1] != (lease.SyncResult{}) {
				t.Fatalf("refused %d, result %+v: want 1 refusal and no result", out.Refused, out.Results[1])
			}
			if out.States[0].Flags&wire.StateRefused != 0 || out.Results[0].NowUs != e.clock.Now() {
				t.Fatalf("good delta not applied at the clock's now: %+v", out.States[0])
			}
			// Charged once: a refused duplicate is not charged on top.
			if got, want := e.read("gw-1", good).Remaining, 95-int64(out.States[0].Lease); got != want {
				t.Fatalf("good bucket: %d remaining, want %d (5 consumed, lease %d out)", got, want, out.States[0].Lease)
			}
		})
	}
}

// testNodeEmpty: a batch names its gateway; without one it is invalid, not applied.
func testNodeEmpty(t *testing.T, e *env) {
	b := &wire.Batch{Seq: 1, Deltas: []wire.Delta{fixed("k", 10)}}
	_, err := e.be.Apply(context.Background(), b, backend.Options{Idempotent: true})
	if e.twin != nil {
		e.compare(b, backend.Options{Idempotent: true}, nil, err)
	}
	if !errors.Is(err, backend.ErrInvalid) {
		t.Fatalf("batch without a node: error %v, want one wrapping ErrInvalid", err)
	}
}

// testHeartbeat: a batch without deltas is answered with the fleet size and nothing else.
func testHeartbeat(t *testing.T, e *env) {
	out := e.sync("gw-1")
	if len(out.States) != 0 || out.Nodes < 1 || out.ServerTimeUs != 0 || out.Refused != 0 {
		t.Fatalf("heartbeat: %+v, want no states, no server time, a fleet of at least one", out)
	}
}

// testReplay: a batch resent with the same seq is answered from its first application
// (the same leases, at its time) and changes nothing; an older seq is a replay that
// hands over nothing; the next seq is applied.
func testReplay(t *testing.T, e *env) {
	d := fixed("replay", 100)
	d.Over, d.ElapsedMs = 10, 100
	b := &wire.Batch{Node: "gw-1", Seq: 5, Deltas: []wire.Delta{d}}
	first := e.apply(b, backend.Options{Idempotent: true})
	st := first.States[0]
	if st.Flags&(wire.StateReplay|wire.StateRefused) != 0 || st.Lease == 0 || first.ServerTimeUs != T0 {
		t.Fatalf("first application: %+v at %d, want a lease at %d", st, first.ServerTimeUs, T0)
	}
	e.clock.Advance(50 * time.Millisecond)
	again := e.apply(b, backend.Options{Idempotent: true})
	rs := again.States[0]
	if rs.Flags&wire.StateReplay == 0 || rs.Flags&wire.StateAllowed == 0 {
		t.Fatalf("resent batch: flags %b, want replay and allowed", rs.Flags)
	}
	if rs.Lease != st.Lease || rs.Held != st.Held || rs.Epoch != st.Epoch || rs.ValidMs != st.ValidMs || rs.LowWater != st.LowWater {
		t.Fatalf("replay answered lease %d held %d epoch %d valid %d low %d, want the first's %d %d %d %d %d",
			rs.Lease, rs.Held, rs.Epoch, rs.ValidMs, rs.LowWater, st.Lease, st.Held, st.Epoch, st.ValidMs, st.LowWater)
	}
	if again.ServerTimeUs != T0 || rs.ServerMs != uint64(T0/1000) {
		t.Fatalf("replay at server time %d (state %d ms), want the first application's %d", again.ServerTimeUs, rs.ServerMs, T0)
	}
	// Charged and granted once.
	if got, want := e.read("gw-1", d).Remaining, int64(100-10)-int64(st.Lease); got != want {
		t.Fatalf("after the replay: %d remaining, want %d (100 - 10 consumed - lease %d)", got, want, st.Lease)
	}
	b.Seq = 4
	old := e.apply(b, backend.Options{Idempotent: true}).States[0]
	if old.Flags&wire.StateReplay == 0 || old.Lease != 0 || old.Held != 0 {
		t.Fatalf("older seq: %+v, want a replay handing over no lease", old)
	}
	b.Seq = 6
	next := e.apply(b, backend.Options{Idempotent: true})
	if next.States[0].Flags&wire.StateReplay != 0 || next.ServerTimeUs != e.clock.Now() {
		t.Fatalf("next seq: %+v at %d, want applied now", next.States[0], next.ServerTimeUs)
	}
}

// testChunks: a batch of more than backend.MaxPerCall deltas is applied whole, answered
// in order, and replayed whole; the chunks are cut from the deltas accepted, so a refused
// delta in the first chunk moves the cut the same way on the resend.
func testChunks(t *testing.T, e *env) {
	const n = 2*backend.MaxPerCall + 50
	ds := make([]wire.Delta, n)
	for i := range ds {
		ds[i] = fixed(fmt.Sprint("chunk-", i), 100)
		ds[i].Over = 1
	}
	ds[40].Rule = "" // refused
	b := &wire.Batch{Node: "gw-1", Seq: 1, Deltas: ds}
	first := e.apply(b, backend.Options{Idempotent: true})
	if first.Refused != 1 || first.States[40].Flags != wire.StateRefused {
		t.Fatalf("refused %d (delta 40: %+v), want delta 40 alone", first.Refused, first.States[40])
	}
	for i, st := range first.States {
		if st.Key != ds[i].Key {
			t.Fatalf("state %d answers %q, want %q: out of order", i, st.Key, ds[i].Key)
		}
		if i != 40 && st.Flags&(wire.StateRefused|wire.StateReplay) != 0 {
			t.Fatalf("delta %d not applied: %+v", i, st)
		}
	}
	e.clock.Advance(10 * time.Millisecond)
	again := e.apply(b, backend.Options{Idempotent: true})
	for i, st := range again.States {
		if i == 40 {
			continue
		}
		if st.Flags&wire.StateReplay == 0 || st.Lease != first.States[i].Lease || st.Epoch != first.States[i].Epoch {
			t.Fatalf("resent delta %d: %+v, want the replay of %+v", i, st, first.States[i])
		}
	}
	for _, i := range []int{0, 99, 100, 101, 199, 200, n - 1} {
		if got, want := e.read("gw-1", ds[i]).Remaining, int64(99)-int64(first.States[i].Lease); got != want {
			t.Fatalf("delta %d's bucket: %d remaining, want %d (charged once)", i, got, want)
		}
	}
}

// testCheck: checks and acquires are not recorded: the same seq is applied again, and a
// strict check is allowed while the bucket holds its cost, refused after.
func testCheck(t *testing.T, e *env) {
	d := fixed("check", 100)
	d.Flags, d.Over = wire.FlagStrict, 60
	b := &wire.Batch{Node: "gw-1", Seq: 1, Deltas: []wire.Delta{d}}
	first := e.apply(b, backend.Options{}).States[0]
	if first.Flags != wire.StateAllowed || first.Remaining != 40 || first.Lease != 0 {
		t.Fatalf("first check: %+v, want allowed, 40 remaining, no lease", first)
	}
	second := e.apply(b, backend.Options{}).States[0]
	if second.Flags&(wire.StateAllowed|wire.StateReplay) != 0 || second.Remaining != 40 || second.RetryInMs == 0 {
		t.Fatalf("the same check again: %+v, want refused (not a replay) with 40 remaining and a retry time", second)
	}
}

// testStoreKey: every record is named by the stored form of the caller key, and the
// states answer with the key as sent.
func testStoreKey(t *testing.T, e *env) {
	lower := backend.Options{Idempotent: true, StoreKey: strings.ToLower}
	d := fixed("Caller", 100)
	d.Over = 30
	first := e.apply(&wire.Batch{Node: "gw-1", Seq: 1, Deltas: []wire.Delta{d}}, lower).States[0]
	if first.Key != "Caller" {
		t.Fatalf("state answers key %q, want the key as sent", first.Key)
	}
	r := fixed("cALLER", 100)
	r.Flags = wire.FlagStrict
	st := e.apply(&wire.Batch{Node: "gw-1", Seq: 2, Deltas: []wire.Delta{r}}, backend.Options{StoreKey: strings.ToLower}).States[0]
	if want := 70 - int64(first.Lease); st.Key != "cALLER" || st.Remaining != want {
		t.Fatalf("another spelling of the stored key: %+v, want key %q and %d remaining", st, "cALLER", want)
	}
	if got := e.read("gw-1", d).Remaining; got != 100 {
		t.Fatalf("the raw key's bucket: %d remaining, want 100 (untouched)", got)
	}
}

// testLeaseLifecycle: a lone gateway's demand earns a lease, valid for a while; it renews
// what it still holds at its next report, gives back what it returns, and a lease it
// stops reporting is reclaimed when its epoch has ended twice.
func testLeaseLifecycle(t *testing.T, e *env) {
	d := fixed("lease", 100)
	d.Over, d.ElapsedMs = 10, 100
	g := e.sync("gw-1", d).States[0]
	if g.Lease == 0 || g.Lease > 50 || g.Epoch == 0 || g.ValidMs == 0 || g.LowWater > g.Lease/2 {
		t.Fatalf("first report: %+v, want a lease of 1..50 (capacity/MaxShare) valid for a while, low water at most half", g)
	}
	if got, want := e.read("gw-1", d).Remaining, int64(90)-int64(g.Lease); got != want {
		t.Fatalf("with the lease out: %d remaining, want %d", got, want)
	}
	e.clock.Advance(100 * time.Millisecond)
	r := fixed("lease", 100)
	r.Leased, r.Held, r.Epoch, r.ElapsedMs = 5, g.Lease-5, g.Epoch, 100
	renew := e.sync("gw-1", r).States[0]
	if renew.Held != g.Lease-5 {
		t.Fatalf("renewal: held %d, want the %d the gateway kept", renew.Held, g.Lease-5)
	}
	held := renew.Held + renew.Lease
	e.clock.Advance(100 * time.Millisecond)
	ret := fixed("lease", 100)
	ret.Returned, ret.Epoch, ret.ElapsedMs = held, renew.Epoch, 100
	if st := e.apply(&wire.Batch{Node: "gw-1", Seq: 100, Deltas: []wire.Delta{ret}}, backend.Options{Idempotent: true, NoLease: true}).States[0]; st.Held != 0 || st.Lease != 0 {
		t.Fatalf("release: %+v, want nothing held or granted", st)
	}
	if got := e.read("gw-1", d).Remaining; got != 85 {
		t.Fatalf("after the release: %d remaining, want 85 (15 consumed, nothing out)", got)
	}
	// A lease nobody reports again is reclaimed within two epochs.
	e.clock.Advance(100 * time.Millisecond)
	again := fixed("lease", 100)
	again.Over, again.ElapsedMs = 5, 100
	out := e.apply(&wire.Batch{Node: "gw-1", Seq: 101, Deltas: []wire.Delta{again}}, backend.Options{Idempotent: true}).States[0]
	if out.Lease == 0 {
		t.Fatalf("report after the release: %+v, want a new lease", out)
	}
	e.clock.Advance(2 * time.Duration(Lease.EpochMs) * time.Millisecond)
	if got := e.read("gw-1", d).Remaining; got != 80 {
		t.Fatalf("two epochs after an unreported lease of %d: %d remaining, want 80 (reclaimed)", out.Lease, got)
	}
}

// testNoLease: with NoLease (a gateway of the previous protocol) demand earns no lease.
func testNoLease(t *testing.T, e *env) {
	d := fixed("nolease", 100)
	d.Over, d.ElapsedMs = 10, 100
	st := e.apply(&wire.Batch{Node: "gw-1", Seq: 1, Deltas: []wire.Delta{d}}, backend.Options{Idempotent: true, NoLease: true}).States[0]
	if st.Lease != 0 || st.ValidMs != 0 || st.Remaining != 90 {
		t.Fatalf("NoLease: %+v, want no lease and 90 remaining", st)
	}
}

// testPenalty: a lone gateway's early requests on a spent key start a cooldown that
// doubles per step, refuses checks and withholds leases while it runs, ends on time, and
// is forgotten after PenaltyMaxUs of calm.
func testPenalty(t *testing.T, e *env) {
	base := time.Duration(Lease.PenaltyBaseUs) * time.Microsecond
	d := fixed("penalty", 10)
	d.Over, d.ElapsedMs = 10, 100
	e.sync("gw-1", d)
	early := fixed("penalty", 10)
	early.Rejected, early.Early, early.ElapsedMs = 3, 1, 100
	st := e.sync("gw-1", early).States[0]
	if st.PenaltyLevel != 1 || st.PenaltyInMs != uint32(base.Milliseconds()) || st.Lease != 0 {
		t.Fatalf("first early claim: level %d, cooldown %d ms, lease %d; want level 1, %d ms, no lease", st.PenaltyLevel, st.PenaltyInMs, st.Lease, base.Milliseconds())
	}
	e.clock.Advance(base / 2)
	chk := fixed("penalty", 10)
	chk.Flags, chk.Over = wire.FlagStrict, 1
	if st := e.apply(&wire.Batch{Node: "gw-1", Seq: 1, Deltas: []wire.Delta{chk}}, backend.Options{}).States[0]; st.Flags&wire.StateAllowed != 0 || st.PenaltyInMs != uint32(base.Milliseconds()/2) {
		t.Fatalf("check during the cooldown: %+v, want refused with %d ms left", st, base.Milliseconds()/2)
	}
	e.clock.Advance(base / 2)
	st = e.sync("gw-1", early).States[0]
	if st.PenaltyLevel != 2 || st.PenaltyInMs != uint32(2*base.Milliseconds()) {
		t.Fatalf("an early claim a base period later: level %d, cooldown %d ms; want level 2, %d ms", st.PenaltyLevel, st.PenaltyInMs, 2*base.Milliseconds())
	}
	e.clock.Advance(2*base + time.Millisecond)
	calm := fixed("penalty", 10)
	calm.ElapsedMs = 100
	if st := e.sync("gw-1", calm).States[0]; st.PenaltyInMs != 0 || st.PenaltyLevel != 2 {
		t.Fatalf("after the cooldown: level %d, %d ms; want level 2 kept, no cooldown", st.PenaltyLevel, st.PenaltyInMs)
	}
	e.clock.Advance(time.Duration(Lease.PenaltyMaxUs) * time.Microsecond)
	if st := e.sync("gw-1", calm).States[0]; st.PenaltyLevel != 0 || st.PenaltyInMs != 0 {
		t.Fatalf("after PenaltyMaxUs of calm: level %d, %d ms; want forgiven", st.PenaltyLevel, st.PenaltyInMs)
	}
}

// beat has each node send a heartbeat and returns the fleet sizes they were answered.
func (e *env) beat(nodes ...string) []uint32 {
	e.t.Helper()
	n := make([]uint32, len(nodes))
	for i, node := range nodes {
		n[i] = e.sync(node).Nodes
	}
	return n
}

// formFleet has nodes heartbeat once a virtual second until every one is answered
// len(nodes), and fails if that takes more than rounds or a count exceeds most.
// Backends refresh the count once a second, the store in the background: a short real
// pause lets a refresh land.
func (e *env) formFleet(rounds, most int, nodes ...string) int {
	e.t.Helper()
	for r := 0; r < rounds; r++ {
		got := e.beat(nodes...)
		all := true
		for _, n := range got {
			if int(n) > most {
				e.t.Fatalf("round %d: fleet of %v counted as %d, more than %d", r, nodes, n, most)
			}
			all = all && int(n) == len(nodes)
		}
		if all {
			return r
		}
		e.clock.Advance(time.Second)
		time.Sleep(5 * time.Millisecond)
	}
	e.t.Fatalf("fleet of %d not counted within %d rounds of a second", len(nodes), rounds)
	return 0
}

// testFleet: gateways count once their syncs span the probation, an id sent once never
// counts, and gateways silent for longer than the window stop counting.
func testFleet(t *testing.T, e *env) {
	gws := []string{"gw-1", "gw-2", "gw-3"}
	if n := e.sync("drive-by").Nodes; n != 1 {
		t.Fatalf("first batch ever: fleet of %d, want 1", n)
	}
	if got := e.beat(gws...); got[0] != 1 || got[1] != 1 || got[2] != 1 {
		t.Fatalf("gateways seen for the first time: counted %v, want 1 each (probation)", got)
	}
	e.clock.Advance(time.Second)
	r := e.formFleet(10, len(gws), gws...)
	if r == 0 {
		t.Fatal("fleet counted at once: no probation")
	}
	// Gateways go silent; one comes back after the window. Its first answers may still
	// carry the count of the last refresh that landed (the next drops the silent ones).
	e.clock.Advance(backend.DefaultFleetWindow + 2*time.Second)
	e.formFleet(5, len(gws), "gw-1")
}

// testNodeRecords: in a fleet each gateway's leases of a bucket are recorded apart: one
// gateway holds at most ceil(capacity/MaxShare) beyond what it paid for, renews no more
// than it was granted, and cannot renew another's lease; the others still get leases.
func testNodeRecords(t *testing.T, e *env) {
	e.formFleet(10, 2, "gw-a", "gw-b")
	share := uint32(50) // ceil(100 / MaxShare)
	acq := fixed("node", 100)
	acq.Flags, acq.Over, acq.Want = wire.FlagAcquire|wire.FlagWant, 1, 100
	a := e.sync("gw-a", acq).States[0]
	if a.Flags&wire.StateAllowed == 0 || a.Lease == 0 || a.Lease > share {
		t.Fatalf("gw-a acquires wanting the whole bucket: %+v, want allowed with a lease of 1..%d", a, share)
	}
	acq2 := acq
	acq2.Held, acq2.Epoch = 100, a.Epoch // more than it was granted
	a2 := e.sync("gw-a", acq2).States[0]
	if a2.Held > a.Lease || a2.Held+a2.Lease > share {
		t.Fatalf("gw-a again, reporting 100 held: held %d + lease %d, want at most its %d and %d in all", a2.Held, a2.Lease, a.Lease, share)
	}
	forged := fixed("node", 100)
	forged.Held, forged.Epoch, forged.ElapsedMs = a.Lease, a.Epoch, 100
	if b := e.sync("gw-b", forged).States[0]; b.Held != 0 {
		t.Fatalf("gw-b reporting gw-a's lease as its own: held %d, want 0", b.Held)
	}
	want := fixed("node", 100)
	want.Flags, want.Over, want.Want = wire.FlagAcquire|wire.FlagWant, 1, 20
	if b := e.sync("gw-b", want).States[0]; b.Flags&wire.StateAllowed == 0 || b.Lease == 0 {
		t.Fatalf("gw-b acquires 20: %+v, want allowed with a lease (the bucket is not reserved away)", b)
	}
}

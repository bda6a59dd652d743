package service

import (
	"bytes"
	"encoding/binary"
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

var update = flag.Bool("update", false, "rewrite testdata fixtures")

func delta(key, rule string, kind algo.Kind, limit, windowMs uint32) wire.Delta {
	return wire.Delta{Key: key, Rule: rule, Algo: uint8(kind), Limit: limit, WindowMs: windowMs}
}

func TestSyncAuth(t *testing.T) {
	in := start(t, opts{})
	b := &wire.Batch{Node: "n", Seq: 1, Deltas: []wire.Delta{delta(uniq("auth"), "r", algo.TokenBucket, 10, 1000)}}
	body, _ := wire.AppendBatch(nil, b)
	for _, tc := range []struct {
		name, path, token string
		want              int
	}{
		{"sync without token", "/v1/sync", "", http.StatusUnauthorized},
		{"sync with admin token", "/v1/sync", adminToken, http.StatusUnauthorized},
		{"check without token", "/v1/check", "", http.StatusUnauthorized},
		{"sync", "/v1/sync", syncSecret, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code, _, out := in.do(t, http.MethodPost, tc.path, tc.token, body); code != tc.want {
				t.Fatalf("%d %s, want %d", code, out, tc.want)
			}
		})
	}
	if code, _, _ := in.do(t, http.MethodGet, "/v1/sync/rules", "wrong", nil); code != http.StatusUnauthorized {
		t.Fatalf("GET /v1/sync/rules with a wrong secret: %d", code)
	}
}

// fixtures: malformed or invalid batches, named after the failure they provoke, and the
// status each must get. A batch that decodes is answered 200 even when some of its
// deltas cannot be applied: those come back refused (TestSyncRefusesDeltas).
var fixtures = map[string]struct {
	status int
	build  func() []byte
}{
	"truncated_batch.bin": {400, func() []byte { return validBatch()[:20] }},
	"unknown_version.bin": {400, func() []byte { b := validBatch(); b[0] = 99; return b }},
	"trailing_bytes.bin":  {400, func() []byte { return append(validBatch(), 0) }},
	"empty_node.bin":      {400, func() []byte { return encode(&wire.Batch{Seq: 1, Deltas: []wire.Delta{delta("k", "r", 0, 10, 1000)}}) }},
	"zero_limit.bin": {200, func() []byte {
		return encode(&wire.Batch{Node: "n", Deltas: []wire.Delta{delta("k", "r", 0, 0, 1000)}})
	}},
	"unknown_algorithm.bin": {200, func() []byte {
		return encode(&wire.Batch{Node: "n", Deltas: []wire.Delta{delta("k", "r", 7, 10, 1000)}})
	}},
	"duplicate_bucket.bin": {200, func() []byte {
		d := delta("k", "r", 0, 10, 1000)
		return encode(&wire.Batch{Node: "n", Deltas: []wire.Delta{d, d}})
	}},
	"too_many_deltas.bin": {413, func() []byte {
		// Header of a batch claiming MaxDeltas+1 deltas (the encoder refuses to write one).
		b := []byte{wire.Version, 1, 'n', 0, 1, 0}
		return binary.AppendUvarint(b, wire.MaxDeltas+1)
	}},
}

func validBatch() []byte {
	return encode(&wire.Batch{Node: "gw-1", Seq: 7, Deltas: []wire.Delta{delta("key", "rule", 0, 10, 1000), delta("key2", "rule", 0, 10, 1000)}})
}

func encode(b *wire.Batch) []byte {
	out, err := wire.AppendBatch(nil, b)
	if err != nil {
		panic(err) // test fixture construction only
	}
	return out
}

func TestSyncMalformed(t *testing.T) {
	in := start(t, opts{})
	for name, fx := range fixtures {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join("testdata", name)
			if *update {
				if err := os.WriteFile(path, fx.build(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			body, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create)", err)
			}
			code, _, out := in.do(t, http.MethodPost, "/v1/sync", syncSecret, body)
			if code != fx.status {
				t.Fatalf("%d %q, want %d", code, out, fx.status)
			}
			if len(bytes.TrimSpace(out)) == 0 {
				t.Fatal("error answer without a reason")
			}
		})
	}
}

func TestSyncOversized(t *testing.T) {
	in := start(t, opts{})
	big := make([]byte, wire.MaxBatchSize+1)
	big[0] = wire.Version
	if code, _, out := in.do(t, http.MethodPost, "/v1/sync", syncSecret, big); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("%d %s, want 413", code, out)
	}
	// Without a Content-Length the limit still holds (chunked upload).
	req, _ := http.NewRequest(http.MethodPost, in.http.URL+"/v1/sync", struct{ *bytes.Reader }{bytes.NewReader(big)})
	req.Header.Set("Authorization", "Bearer "+syncSecret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked oversized batch: %d, want 413", resp.StatusCode)
	}
}

// FuzzSyncBody: any body gets 200, 400 or 413 — never a 5xx or a hang — while Redis is up.
func FuzzSyncBody(f *testing.F) {
	in := start(f, opts{})
	f.Add(validBatch())
	for _, fx := range fixtures {
		f.Add(fx.build())
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		code, _, out := in.do(t, http.MethodPost, "/v1/sync", syncSecret, body)
		switch code {
		case http.StatusOK, http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("status %d (%s) for %x", code, out, body)
		}
	})
}

// TestSyncIdempotent: a retried batch (same node, worker, seq) is applied once and gets
// the same lease back.
func TestSyncIdempotent(t *testing.T) {
	for _, mode := range []store.Mode{store.Standalone, store.Cluster} {
		t.Run(string(mode), func(t *testing.T) {
			in := start(t, opts{mode: mode})
			key := uniq("idem")
			d := delta(key, "api", algo.FixedWindow, 1000, 60_000)
			d.Over = 100
			b := &wire.Batch{Node: "gw-a", Seq: uint64(time.Now().UnixMicro()), Deltas: []wire.Delta{d}}
			first := in.sync(t, "/v1/sync", b)
			again := in.sync(t, "/v1/sync", b)
			f, g := first.States[0], again.States[0]
			if f.Lease == 0 || f.Lease != g.Lease || f.Held != g.Held || f.Epoch != g.Epoch || f.ServerMs != g.ServerMs ||
				g.Flags&wire.StateReplay == 0 || f.Flags&wire.StateReplay != 0 {
				t.Fatalf("first %+v, retry %+v", f, g)
			}
			if got := f.Remaining + int64(f.Lease); got != 900 {
				t.Fatalf("remaining %d + lease %d, want 1000-100 charged once", f.Remaining, f.Lease)
			}
			// Charged once: a third, new batch sees the same bucket (it reports a refusal,
			// which charges nothing: a delta that reports nothing is not answered).
			d.Over, d.Rejected = 0, 1
			third := in.sync(t, "/v1/sync", &wire.Batch{Node: "gw-a", Seq: b.Seq + 1, Deltas: []wire.Delta{d}}).States[0]
			if third.Remaining+int64(third.Lease) != f.Remaining {
				t.Fatalf("after the replay: remaining %d + lease %d, want %d", third.Remaining, third.Lease, f.Remaining)
			}
			if first.Nodes < 1 || first.ServerTimeUs == 0 {
				t.Fatalf("reply without fleet size or server time: %+v", first)
			}
		})
	}
}

// TestCheckStrict: /v1/check decides Over synchronously.
func TestCheckStrict(t *testing.T) {
	in := start(t, opts{})
	key := uniq("strict")
	for i := 1; i <= 5; i++ {
		d := delta(key, "pay", algo.FixedWindow, 3, 60_000)
		d.Over = 1
		r := in.sync(t, "/v1/check", &wire.Batch{Node: "gw", Seq: uint64(i), Deltas: []wire.Delta{d}})
		st := r.States[0]
		if want := i <= 3; st.Allowed() != want {
			t.Fatalf("check %d: allowed %v, want %v (%+v)", i, st.Allowed(), want, st)
		}
		if !st.Allowed() && st.RetryInMs == 0 {
			t.Fatalf("check %d refused without a retry time", i)
		}
		if st.Lease != 0 {
			t.Fatalf("strict check granted a lease")
		}
	}
}

// TestPenaltiesGrowAndCap drives the service clock: callers that keep coming back
// early get a cooldown that doubles per base interval up to the cap, whether their
// retries reach one gateway (its own cooldown, in its answers) or a new gateway each
// time (the key's, corroborated by every gateway that claimed; TestAttackPenaltyLockout).
func TestPenaltiesGrowAndCap(t *testing.T) {
	for _, spread := range []bool{false, true} {
		t.Run(map[bool]string{false: "one gateway", true: "a new gateway each time"}[spread], func(t *testing.T) {
			penaltiesGrowAndCap(t, spread)
		})
	}
}

func penaltiesGrowAndCap(t *testing.T, spread bool) {
	in := start(t, opts{})
	var clock atomic.Int64
	clock.Store(time.Now().UnixMicro())
	in.st.SetTestClock(clock.Load)
	cfg := in.st.Config().Lease
	key := uniq("pen")
	var level uint8
	var capped int
	for i := 1; i <= 8; i++ {
		clock.Add(cfg.PenaltyBaseUs)
		d := delta(key, "api", algo.TokenBucket, 10, 1000)
		d.Over, d.Rejected, d.Early = 10, 3, 2 // the gateway spent the bucket, then refused early retries
		node, seq := "gw", uint64(i)
		if spread {
			node, seq = "gw"+strconv.Itoa(i), 1
		}
		st := in.sync(t, "/v1/sync", &wire.Batch{Node: node, Seq: seq, Deltas: []wire.Delta{d}}).States[0]
		if st.PenaltyLevel < level {
			t.Fatalf("step %d: level fell %d -> %d", i, level, st.PenaltyLevel)
		}
		level = st.PenaltyLevel
		max := uint32(cfg.PenaltyMaxUs / 1000)
		if st.PenaltyInMs > max {
			t.Fatalf("step %d: cooldown %d ms above the cap %d", i, st.PenaltyInMs, max)
		}
		if st.PenaltyInMs == max {
			capped++
		}
		if st.Lease != 0 {
			t.Fatalf("penalized key got a lease")
		}
	}
	if level < 3 || capped == 0 {
		t.Fatalf("penalty did not grow to the cap: level %d, capped %d times", level, capped)
	}
}

// TestSyncUnavailable: with Redis down /v1/sync answers 503 within the batch deadline
// (an upper bound from config, plus scheduling slack), /readyz says not ready, and after
// Redis comes back (empty, scripts gone) the gateway's late batch is applied and counted.
func TestSyncUnavailable(t *testing.T) {
	srv := redistest.StartStandalone(t)
	in := start(t, opts{addrs: srv.Addrs(), store: func(c *store.Config) {
		c.DialTimeout, c.ReadTimeout, c.WriteTimeout = 200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond
	}})
	key := uniq("down")
	d := delta(key, "api", algo.FixedWindow, 100, 60_000)
	d.Over = 5
	in.sync(t, "/v1/sync", &wire.Batch{Node: "gw", Seq: 1, Deltas: []wire.Delta{d}})
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	d.Over = 30 // admitted locally while the service could not reach Redis
	late := &wire.Batch{Node: "gw", Seq: 2, Deltas: []wire.Delta{d}}
	body, _ := wire.AppendBatch(nil, late)
	bound := in.svc.BatchTimeout() + time.Second
	startAt := time.Now()
	code, hdr, _ := in.do(t, http.MethodPost, "/v1/sync", syncSecret, body)
	if took := time.Since(startAt); took > bound {
		t.Errorf("503 took %v, more than the batch deadline %v + 1 s", took, in.svc.BatchTimeout())
	}
	if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" {
		t.Fatalf("with Redis down: %d (Retry-After %q), want 503 with Retry-After", code, hdr.Get("Retry-After"))
	}
	if code, _, _ := in.do(t, http.MethodGet, "/readyz", "", nil); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with Redis down: %d", code)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	st := in.sync(t, "/v1/sync", late).States[0]
	if got := st.Remaining + int64(st.Lease); got != 70 {
		t.Fatalf("late batch on the restarted server: remaining+lease %d, want 100-30", got)
	}
	if code, _, _ := in.do(t, http.MethodGet, "/readyz", "", nil); code != http.StatusOK {
		t.Fatalf("/readyz after restart: %d", code)
	}
}

// TestSyncClusterManySlots: a 1000-delta batch over 1000 keys through HTTP on a cluster.
func TestSyncClusterManySlots(t *testing.T) {
	in := start(t, opts{mode: store.Cluster})
	b := &wire.Batch{Node: "gw", Seq: 1}
	prefix := uniq("slots")
	for i := 0; i < 1000; i++ {
		d := delta(prefix+"-"+string(rune('a'+i%26))+strings.Repeat("x", i%40)+"-"+strconv.Itoa(i), "api", algo.Kind(i%5), 500, 60_000)
		d.Over = 2
		b.Deltas = append(b.Deltas, d)
	}
	r := in.sync(t, "/v1/sync", b)
	for i, st := range r.States {
		if st.Key != b.Deltas[i].Key || st.Remaining+int64(st.Lease) != 498 {
			t.Fatalf("state %d: %+v", i, st)
		}
	}
}

func TestHealthAndMetrics(t *testing.T) {
	in := start(t, opts{})
	for _, p := range []string{"/healthz", "/readyz"} {
		if code, _, out := in.do(t, http.MethodGet, p, "", nil); code != http.StatusOK {
			t.Fatalf("%s: %d %s", p, code, out)
		}
	}
	d := delta(uniq("metrics"), "api", algo.TokenBucket, 10, 1000)
	d.Over, d.Rejected = 1, 2
	in.sync(t, "/v1/sync", &wire.Batch{Node: "gw", Seq: 1, Deltas: []wire.Delta{d}})
	_, _, out := in.do(t, http.MethodGet, "/metrics", "", nil)
	for _, want := range []string{
		`tollgate_sync_batches_total{endpoint="sync",outcome="ok"} 1`,
		`tollgate_sync_deltas_total{endpoint="sync"} 1`,
		`tollgate_rejections_total{rule="api"} 2`,
		`tollgate_lease_grants_total 1`,
		`tollgate_redis_seconds_bucket{op="sync"`,
	} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestSyncRefusesDeltas: a delta the service cannot apply is refused on its own, with
// the reason, and the rest of the batch is applied.
func TestSyncRefusesDeltas(t *testing.T) {
	in := start(t, opts{})
	key := uniq("refuse")
	good := delta(key, "api", algo.FixedWindow, 100, 60_000)
	good.Over = 10
	bad := delta(key, "api2", algo.FixedWindow, 0, 60_000)
	odd := delta(key, "api3", algo.Kind(9), 10, 1000)
	r := in.sync(t, "/v1/sync", &wire.Batch{Node: "gw", Seq: 1, Deltas: []wire.Delta{bad, good, odd, good}})
	for i, want := range []string{"params: limit: must be in [1, ", "", "params: algorithm: unknown algorithm 9", "bucket appears twice"} {
		st := r.States[i]
		refused := st.Flags&wire.StateRefused != 0
		if refused != (want != "") || !strings.HasPrefix(st.Reason, want) {
			t.Fatalf("state %d: flags %b reason %q, want refusal %q", i, st.Flags, st.Reason, want)
		}
	}
	if got := r.States[1].Remaining + int64(r.States[1].Lease); got != 90 {
		t.Fatalf("the valid delta: remaining+lease %d, want 90", got)
	}
	_, _, out := in.do(t, http.MethodGet, "/metrics", "", nil)
	if !bytes.Contains(out, []byte(`tollgate_sync_deltas_refused_total{endpoint="sync"} 3`)) {
		t.Errorf("/metrics lacks 3 refused deltas")
	}
}

// TestSyncHeartbeat: a batch without deltas (a gateway's tick with nothing to report)
// is answered with the rules version and the fleet size, and touches no bucket.
func TestSyncHeartbeat(t *testing.T) {
	in := start(t, opts{})
	r := in.sync(t, "/v1/sync", &wire.Batch{Node: uniq("hb"), Seq: 1})
	if len(r.States) != 0 || r.Nodes < 1 {
		t.Fatalf("heartbeat reply %+v", r)
	}
}

// TestCheckAcquire: a paused request's acquire takes its cost when the bucket can give
// it (beyond every lease) and brings a lease; refused once the bucket is spent.
func TestCheckAcquire(t *testing.T) {
	in := start(t, opts{})
	key := uniq("acq")
	var leased int64
	for i := 1; i <= 30; i++ {
		d := delta(key, "api", algo.FixedWindow, 10, 60_000)
		d.Over, d.Flags, d.ElapsedMs = 1, wire.FlagAcquire, 100
		st := in.sync(t, "/v1/check", &wire.Batch{Node: "gw-" + strconv.Itoa(i%3), Seq: uint64(i), Deltas: []wire.Delta{d}}).States[0]
		if st.Allowed() {
			leased += int64(st.Lease)
			if st.Lease > 0 && (st.Epoch == 0 || st.ValidMs == 0) {
				t.Fatalf("acquire %d: lease without epoch or validity: %+v", i, st)
			}
		}
		if i == 30 && (st.Allowed() || st.Remaining != 0) {
			t.Fatalf("acquire 30 of a 10/min bucket: %+v", st)
		}
	}
	if leased == 0 {
		t.Fatal("no acquire brought a lease")
	}
}

// TestSyncVersion1: a gateway on the previous protocol gets a previous-protocol answer:
// its admissions are charged to the same buckets, it gets no lease, and a retried batch
// is not charged twice.
func TestSyncVersion1(t *testing.T) {
	in := start(t, opts{})
	key := uniq("v1")
	old := &wire.BatchV1{Node: "gw-old", Worker: 3, Seq: 5, Deltas: []wire.DeltaV1{
		{Key: key, Rule: "api", Leased: 4, Over: 6, Rejected: 1, Algo: uint8(algo.FixedWindow), Limit: 100, WindowMs: 60_000},
	}}
	body, err := wire.AppendBatchV1(nil, old)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		code, _, out := in.do(t, http.MethodPost, "/v1/sync", syncSecret, body)
		if code != http.StatusOK {
			t.Fatalf("v1 batch: %d %s", code, out)
		}
		var rep wire.ReplyV1
		if err := wire.DecodeReplyV1(out, &rep); err != nil {
			t.Fatalf("v1 reply: %v", err)
		}
		if st := rep.States[0]; st.Lease != 0 || st.Key != key {
			t.Fatalf("v1 state %+v", st)
		}
	}
	// A current gateway sees the 10 permits charged once (it reports a refusal, which
	// charges nothing).
	d := delta(key, "api", algo.FixedWindow, 100, 60_000)
	d.Rejected = 1
	st := in.sync(t, "/v1/sync", &wire.Batch{Node: "gw-new", Seq: 1, Deltas: []wire.Delta{d}}).States[0]
	if got := st.Remaining + int64(st.Lease); got != 90 {
		t.Fatalf("after the v1 batch: remaining+lease %d, want 90", got)
	}
}

// TestSyncResolvesAgainstRules: with a rule set at the service, a delta is charged under
// the service's limits for its rule (a gateway cannot raise them by sending others), a
// delta of a rule the service does not know is refused, and a seq far ahead of the
// service's clock is refused (it would make the gateway's real batches look like
// replays).
func TestSyncResolvesAgainstRules(t *testing.T) {
	in := start(t, opts{})
	if code, _, out := in.do(t, http.MethodPut, "/v1/rules", adminToken,
		[]byte(`{"rules":[{"id":"res","limit":10,"window":"1m","algorithm":"fixed_window"}]}`)); code != http.StatusOK {
		t.Fatalf("PUT /v1/rules: %d %s", code, out)
	}
	eventually(t, 5*time.Second, "rules version", func() bool { return in.svc.Watcher().Version() > 0 })
	key := uniq("res")
	forged := delta(key, "res", algo.FixedWindow, 1000, 60_000) // asks for 1000/min
	forged.Over = 4
	unknown := delta(key, "nope", algo.FixedWindow, 10, 60_000)
	r := in.sync(t, "/v1/sync", &wire.Batch{Node: "gw", Seq: 1, Deltas: []wire.Delta{forged, unknown}})
	if st := r.States[0]; st.Flags&wire.StateRefused != 0 || st.Remaining+int64(st.Lease) != 6 {
		t.Fatalf("forged limit: %+v, want charged under the service's 10/min (remaining+lease 6)", st)
	}
	if st := r.States[1]; st.Flags&wire.StateRefused == 0 || !strings.Contains(st.Reason, "not in the service's rule set") {
		t.Fatalf("unknown rule: %+v", st)
	}
	future := &wire.Batch{Node: "gw", Seq: uint64(time.Now().Add(time.Hour).UnixMicro()), Deltas: []wire.Delta{forged}}
	body, _ := wire.AppendBatch(nil, future)
	if code, _, out := in.do(t, http.MethodPost, "/v1/sync", syncSecret, body); code != http.StatusBadRequest || !bytes.Contains(out, []byte("seq")) {
		t.Fatalf("future seq: %d %s", code, out)
	}
}

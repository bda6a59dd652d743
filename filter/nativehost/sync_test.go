package nativehost_test

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/nativehost"
	"github.com/tollgate-rl/tollgate/internal/memservice"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// fleet is gateways of the filter, natively, against an in-memory sync service, on one
// virtual clock. Callouts are answered instantly (or failed) when deliver runs.
type fleet struct {
	t    *testing.T
	now  int64
	svc  *memservice.Service
	gws  []*nativehost.Host
	down bool // the service refuses connections
	// refuse, when set, is the status the service answers every call with (a rotated
	// secret: 401).
	refuse int
	// lose, when set, picks callouts whose answer the host never delivers.
	lose func(*nativehost.Callout) bool
}

func newFleet(t *testing.T, gateways, workers int, rules string) *fleet {
	t.Helper()
	return newFleetSync(t, gateways, workers, "", rules)
}

// newFleetSync is newFleet with more sync settings (JSON members, e.g. `"table_slots":64`).
func newFleetSync(t *testing.T, gateways, workers int, sync, rules string) *fleet {
	t.Helper()
	f := &fleet{t: t, now: 1_700_000_000_000_000, svc: memservice.New(lease.SyncConfig{})}
	if !strings.Contains(sync, `"stale_ms"`) {
		sync = `"stale_ms":500,` + sync // unless the test sets its own
	}
	cfg := []byte(`{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
		"sync":{"cluster":"svc","interval_ms":100,` + strings.TrimSuffix(sync, ",") + `},"rules":` + rules + `}`)
	for g := 0; g < gateways; g++ {
		h, err := nativehost.New(nativehost.Config{
			Workers: workers, PluginConfig: cfg, Clock: func() int64 { return f.now },
			Properties: map[string]string{"node.id": "gw-" + strconv.Itoa(g)},
		})
		if err != nil {
			t.Fatal(err)
		}
		f.gws = append(f.gws, h)
	}
	t.Cleanup(func() {
		// A gateway never sends what the service must refuse (a bucket twice in one
		// batch, parameters out of range): a refused delta's consumption is lost.
		if f.svc.Refused != 0 {
			t.Errorf("the service refused %d deltas", f.svc.Refused)
		}
	})
	return f
}

// deliver answers every waiting callout of every gateway (repeatedly: answers can cause
// callouts).
func (f *fleet) deliver() {
	for more := true; more; {
		more = false
		for _, h := range f.gws {
			for _, c := range h.TakeCallouts() {
				more = true
				if f.lose != nil && f.lose(c) {
					continue
				}
				if f.down {
					h.Fail(c, false)
					continue
				}
				if f.refuse != 0 {
					h.Respond(c, [][2]string{{":status", strconv.Itoa(f.refuse)}}, []byte(`{"error":"unauthorized"}`))
					continue
				}
				status, body := f.svc.Handle(c.Header(":path"), c.Body, f.now)
				h.Respond(c, [][2]string{{":status", strconv.Itoa(status)}}, body)
			}
		}
	}
}

// records describes each gateway's record of key's bucket (for failures).
func (f *fleet) records(key string) string {
	var out []string
	for g, h := range f.gws {
		h.Shared().Range(func(k string, v []byte, _ uint32) {
			if !strings.HasPrefix(k, "tg:s:") || !strings.Contains(string(v), key) {
				return
			}
			n, m := binary.Uvarint(v)
			var r lease.Record
			if m > 0 && lease.DecodeRecord(v[m+int(n):], &r) == nil {
				out = append(out, fmt.Sprintf("gw%d{lease %d until %+dms global %d retry %+dms pending %+v cut %d}",
					g, r.LeaseLeft, (r.LeaseUntilUs-f.now)/1000, r.GlobalRemaining, (r.RetryUs-f.now)/1000, r.Pending, r.CutSeq))
			}
		})
	}
	return strings.Join(out, " ")
}

// tick advances the clock by ms and fires every worker's tick, delivering callouts.
func (f *fleet) tick(ms int) {
	f.now += int64(ms) * 1000
	for _, h := range f.gws {
		for w := range h.Workers() {
			h.Tick(w)
		}
	}
	f.deliver()
}

// send runs one request for key on gateway g, worker w, and delivers what it asked.
func (f *fleet) send(g, w int, key string) *nativehost.Stream {
	s := f.gws[g].Request(w, [][2]string{{":method", "GET"}, {":path", "/api"}, {":authority", "a"}, {"x-api-key", key}}, nil)
	f.deliver()
	return s
}

// A key spent through several gateways and workers, each request either served from a
// lease or acquired: exactly the limit is admitted, and once every gateway has
// reported, the service has charged exactly that.
func TestFleetAdmitsTheLimit(t *testing.T) {
	for _, gws := range []int{1, 2, 4} {
		t.Run(strconv.Itoa(gws)+"_gateways", func(t *testing.T) {
			f := newFleet(t, gws, 2, `[{"id":"api","limit":100,"window":"1h"}]`)
			// The client sends on after refusals: without this, progressive penalties
			// (RATIONALE §3) would refuse it while leases are still out.
			f.svc.NoPenalty = true
			f.tick(100)
			admitted := 0
			for i := 0; i < 1000; i++ {
				s := f.send(i%gws, (i/gws)%2, "k")
				if !s.Decided {
					t.Fatalf("request %d still paused after its callouts were answered", i)
				}
				if s.Admitted() {
					admitted++
				}
				if i%7 == 0 {
					f.tick(10)
				}
			}
			if admitted != 100 {
				b := f.svc.Bucket("k", "api", "", 0, f.now)
				t.Fatalf("admitted %d, want exactly the limit 100 (service: %+v; gateways: %s)", admitted, b, f.records("k"))
			}
			for range 20 {
				f.tick(100)
			}
			b := f.svc.Bucket("k", "api", "", 0, f.now)
			if b == nil {
				t.Fatal("no bucket at the service")
			}
			t.Logf("%d gateways: service: outstanding %d, batches %d, deltas %d", gws, b.Leases.Outstanding(), f.svc.Batches, f.svc.Deltas)
		})
	}
}

// A shadow rule on a gateway that syncs: its bucket starts without a lease, which for an
// enforcing rule means an acquire. A shadow rule must neither pause the request for it
// nor stay silent: the first 5 of 20 requests fit the 5/min bucket, the other 15 are
// admitted and flagged, none is marked degraded, and no acquire is sent.
func TestShadowRuleWithSync(t *testing.T) {
	f := newFleet(t, 1, 2, `[{"id":"trial","limit":5,"window":"1m","shadow":true}]`)
	f.tick(100)
	flagged := 0
	for i := 0; i < 20; i++ {
		s := f.send(0, i%2, "k")
		if !s.Admitted() {
			t.Fatalf("request %d: a shadow rule refused (status %d)", i, s.Status())
		}
		if s.Header("x-ratelimit-policy") == "degraded" {
			t.Fatalf("request %d marked degraded with the service up", i)
		}
		if got := s.Header("x-ratelimit-shadow") == "trial"; got != (i >= 5) {
			t.Fatalf("request %d: x-ratelimit-shadow %q", i, s.Header("x-ratelimit-shadow"))
		}
		if s.Header("x-ratelimit-shadow") != "" {
			flagged++
		}
	}
	if n := f.gws[0].Metric("tollgate.acquires"); n != 0 {
		t.Errorf("%d acquires for a shadow rule", n)
	}
	if n := f.gws[0].Metric("tollgate.requests_shadow_rejected"); n != int64(flagged) {
		t.Errorf("requests_shadow_rejected %d, %d flagged", n, flagged)
	}
}

// One of two service replicas is dead: the callout that reaches it fails at once (503,
// connection failure). The same batch must be resent at once, not a backoff later, so
// that a gateway behind a cluster with one dead replica never goes two intervals
// without a success (which makes it degraded); once breaker_failures (3) failures are
// in a row it must not be resent at once (a dead service is not hammered).
func TestHardFailureResentAtOnce(t *testing.T) {
	f := newFleet(t, 1, 2, `[{"id":"api","limit":100,"window":"1m"}]`)
	f.tick(100)
	h := f.gws[0]
	for i := 0; i < 5; i++ {
		f.send(0, i%2, "k") // buckets to report
	}
	f.now += 100_000
	for w := range h.Workers() {
		h.Tick(w)
	}
	calls := h.TakeCallouts()
	if len(calls) != 1 || calls[0].Header(":path") != "/v1/sync" {
		t.Fatalf("want one sync callout after the tick, got %d", len(calls))
	}
	first := calls[0]
	h.Fail(first, false)
	calls = h.TakeCallouts()
	if len(calls) != 1 || calls[0].Header(":path") != "/v1/sync" {
		t.Fatalf("after a connection failure: %d callouts, want the batch resent at once", len(calls))
	}
	if string(calls[0].Body) != string(first.Body) {
		t.Fatal("the resent batch differs from the failed one: it must be resent unchanged")
	}
	h.Fail(calls[0], false)
	if calls = h.TakeCallouts(); len(calls) != 1 {
		t.Fatalf("after a second failure: %d callouts, want the batch resent at once", len(calls))
	}
	h.Fail(calls[0], false)
	if calls = h.TakeCallouts(); len(calls) != 0 {
		t.Fatalf("a third failure in a row (the breaker's threshold) was resent at once (%d callouts)", len(calls))
	}
}

// A sync callout that gets no answer: at the next tick the batch goes out again on a
// second callout (a hedge). When the first was merely lost, the hedge's answer keeps the
// gateway healthy and the first one's late timeout changes nothing; when the service
// hangs (neither is answered), every worker answers degraded within two intervals and a
// quarter of the unanswered sync (RATIONALE.md §3: 250 ms at 100 ms intervals).
func TestUnansweredSyncHedgedThenDegraded(t *testing.T) {
	for _, hung := range []bool{false, true} {
		t.Run(map[bool]string{false: "lost callout", true: "hung service"}[hung], func(t *testing.T) {
			f := newFleet(t, 1, 2, `[{"id":"api","limit":1000,"window":"1m"}]`)
			h := f.gws[0]
			f.tick(100)
			f.send(0, 0, "k")
			tick := func() {
				f.now += 100_000
				for w := range h.Workers() {
					h.Tick(w)
				}
			}
			tick()
			first := h.TakeCallouts()
			if len(first) != 1 {
				t.Fatalf("%d callouts after a tick, want the sync", len(first))
			}
			sentAt := f.now
			tick()
			// The same batch again, and a probe of the service (unanswered here: lost, or
			// the service hangs).
			var hedge []*nativehost.Callout
			for _, c := range h.TakeCallouts() {
				if c.Header(":path") != wire.AlivePath {
					hedge = append(hedge, c)
				}
			}
			if len(hedge) != 1 || string(hedge[0].Body) != string(first[0].Body) {
				t.Fatalf("at the next tick: %d callouts, want the same batch once more", len(hedge))
			}
			if !hung {
				status, body := f.svc.Handle(hedge[0].Header(":path"), hedge[0].Body, f.now)
				h.Respond(hedge[0], [][2]string{{":status", strconv.Itoa(status)}}, body)
				h.Fail(first[0], true) // the lost one times out later
				for w := range h.Workers() {
					if s := f.send(0, w, "k"); s.Header("x-ratelimit-policy") == "degraded" {
						t.Fatalf("worker %d degraded after the hedge was answered", w)
					}
				}
				if n := h.Metric("tollgate.sync_failed"); n != 0 {
					t.Fatalf("sync_failed %d: the lost callout's timeout must not count once the hedge answered", n)
				}
				return
			}
			// Neither answers. Within 2.25 intervals of the send every worker is degraded.
			f.now = sentAt + 225_000
			for w := range h.Workers() {
				if s := f.send(0, w, "k"); s.Header("x-ratelimit-policy") != "degraded" {
					t.Fatalf("worker %d not degraded %d ms after the unanswered sync", w, (f.now-sentAt)/1000)
				}
			}
		})
	}
}

// A sync reply that is slow while the service answers acquires is a busy service, not a
// hung one: the gateway stays healthy past the point where an unanswered sync alone
// makes it degraded.
func TestSlowSyncWithAnsweredAcquiresStaysHealthy(t *testing.T) {
	f := newFleet(t, 1, 2, `[{"id":"api","limit":1000,"window":"1m"}]`)
	h := f.gws[0]
	f.tick(100)
	f.send(0, 0, "k")
	f.now += 100_000
	for w := range h.Workers() {
		h.Tick(w)
	}
	pending := h.TakeCallouts() // the sync: left unanswered
	if len(pending) != 1 {
		t.Fatalf("%d callouts after a tick, want the sync", len(pending))
	}
	sentAt := f.now
	for step := 1; step <= 3; step++ {
		f.now = sentAt + int64(step)*75_000
		// A fresh key acquires; the service answers it.
		s := f.send(0, step%2, "fresh"+strconv.Itoa(step))
		if s.Header("x-ratelimit-policy") == "degraded" {
			t.Fatalf("%d ms after the sync was sent, with acquires answered: degraded", (f.now-sentAt)/1000)
		}
	}
}

// A request paused for an acquire whose callout reaches a dead replica (Envoy's 503 for
// a connection failure): the checks are resent at once (twice at most), and the answer
// of the live one decides the request — admitted, not degraded. A third failure decides
// it degraded, and so does a 503 the service itself answered (it may have applied the
// checks: resending could charge them twice).
func TestAcquireResentOnceAfterConnectionFailure(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failures int
		service  bool // the 503 comes from the service, not from the connection
	}{{"one connection failure", 1, false}, {"two connection failures", 2, false}, {"three connection failures", 3, false}, {"the service's 503", 1, true}} {
		t.Run(tc.name, func(t *testing.T) {
			failures := tc.failures
			f := newFleet(t, 1, 2, `[{"id":"api","limit":1000,"window":"1m"}]`)
			h := f.gws[0]
			f.tick(100)
			s := h.Request(0, [][2]string{{":method", "GET"}, {":path", "/api"}, {":authority", "a"}, {"x-api-key", "k"}}, nil)
			for i := 0; i < failures; i++ {
				calls := h.TakeCallouts()
				if len(calls) != 1 || calls[0].Header(":path") != "/v1/check" {
					t.Fatalf("callout %d: %d callouts, want one /v1/check", i+1, len(calls))
				}
				if tc.service {
					h.Respond(calls[0], [][2]string{{":status", "503"}}, []byte("redis: shard unavailable\n"))
				} else {
					h.Fail(calls[0], false)
				}
			}
			f.deliver()
			if !s.Decided || !s.Admitted() {
				t.Fatalf("request not admitted (decided %v, status %d)", s.Decided, s.Status())
			}
			if degraded, want := s.Header("x-ratelimit-policy") == "degraded", failures == 3 || tc.service; degraded != want {
				t.Fatalf("degraded %v, want %v", degraded, want)
			}
		})
	}
}

// A request paused for an acquire when the service hangs does not wait out its callout
// timeout (250 ms): at the first tick where the gateway counts the service as down, it
// is answered like every other request then — degraded — and the late answer of its
// callout changes nothing.
func TestPausedAcquireSettledWhenServiceHangs(t *testing.T) {
	f := newFleet(t, 1, 2, `[{"id":"api","limit":1000,"window":"1m"}]`)
	h := f.gws[0]
	f.tick(100)
	f.send(0, 0, "warm") // one success, then the service hangs: nothing is answered
	tick := func() {     // at the period the filter asked for: a quarter interval
		f.now += int64(h.TickPeriodMs(0)) * 1000
		for w := range h.Workers() {
			h.Tick(w)
		}
	}
	hungAt := f.now
	s := f.gws[0].Request(1, [][2]string{{":method", "GET"}, {":path", "/api"}, {":authority", "a"}, {"x-api-key", "fresh"}}, nil)
	if s.Decided {
		t.Fatal("a fresh key's request was decided without an acquire")
	}
	var pending []*nativehost.Callout
	for !s.Decided && f.now-hungAt < 250_000 {
		tick()
		pending = append(pending, h.TakeCallouts()...)
	}
	if !s.Decided {
		t.Fatalf("still paused %d ms after the service hung, want an answer within 250 ms (before the callout times out)", (f.now-hungAt)/1000)
	}
	if !s.Admitted() || s.Header("x-ratelimit-policy") != "degraded" {
		t.Fatalf("settled as status %d policy %q, want admitted and degraded", s.Status(), s.Header("x-ratelimit-policy"))
	}
	t.Logf("settled %d ms after the service hung", (f.now-hungAt)/1000)
	for _, c := range pending { // the late answers: ignored
		status, body := f.svc.Handle(c.Header(":path"), c.Body, f.now)
		h.Respond(c, [][2]string{{":status", strconv.Itoa(status)}}, body)
	}
	if n := h.Metric("tollgate.requests_allowed"); n != 2 {
		t.Fatalf("requests_allowed %d after the late answers, want 2 (each request answered once)", n)
	}
}

// A service that refuses every batch (401: its secret rotated without the gateways')
// is up: the gateway answers degraded meanwhile, but keeps sending a batch every
// interval instead of backing off, so the first interval after the service accepts
// batches again ends the degraded answers — however long the refusal lasted.
func TestRefusedBatchesRetriedEveryInterval(t *testing.T) {
	f := newFleet(t, 1, 2, `[{"id":"api","limit":100000,"window":"1m"}]`)
	f.tick(100)
	if s := f.send(0, 0, "k"); !s.Admitted() || s.Header("x-ratelimit-policy") == "degraded" {
		t.Fatalf("healthy: admitted %v, policy %q", s.Admitted(), s.Header("x-ratelimit-policy"))
	}
	f.refuse = 401
	for range 100 { // 10 s refused
		f.send(0, 0, "k")
		f.tick(100)
	}
	if s := f.send(0, 1, "k"); s.Header("x-ratelimit-policy") != "degraded" {
		t.Fatalf("refused for 10 s, yet not degraded (policy %q)", s.Header("x-ratelimit-policy"))
	}
	f.refuse = 0
	f.tick(100)
	f.tick(100)
	for w := range 2 {
		if s := f.send(0, w, "k"); s.Header("x-ratelimit-policy") == "degraded" {
			t.Fatalf("worker %d still degraded 200 ms after the service accepts batches again", w)
		}
	}
}

// Each batch carries a bucket at most once, whichever ways it became due in the same
// tick (queued as urgent by several workers, reached by the staleness scan, a lease
// due for renewal): the service refuses a bucket's second delta in a batch, and its
// consumption would be lost. A small table makes the scan pass every slot every few
// ticks, so every way meets every other many times over the run.
func TestBatchCarriesABucketOnce(t *testing.T) {
	for _, rules := range []string{
		`[{"id":"api","limit":50,"window":"1s"}]`,
		`[{"id":"api","algorithm":"gcra","limit":20,"window":"1s","burst":5},{"id":"day","limit":100000,"window":"1d"}]`,
		`[{"id":"api","algorithm":"sliding_window_counter","limit":30,"window":"2s"}]`,
	} {
		t.Run(rules, func(t *testing.T) {
			f := newFleetSync(t, 2, 2, `"table_slots":64,"lease_ttl_ms":300`, rules)
			f.svc.NoPenalty = true
			rng := rand.New(rand.NewPCG(1, 2))
			for step := 0; step < 3000; step++ {
				key := "k" + strconv.Itoa(rng.IntN(3))
				for range rng.IntN(4) {
					f.send(rng.IntN(2), rng.IntN(2), key)
				}
				f.tick(1 + rng.IntN(60))
			}
		})
	}
}

// A key held far above its limit: once the gateway has refused more than a sync
// interval's refill, it asks the service again only after an interval's refill, so a
// second costs about one acquire per interval, not one per permit (a Redis round trip
// per admitted request, what a per-request limiter costs); what it admits stays the
// limit.
func TestHotKeyAcquiresOncePerInterval(t *testing.T) {
	f := newFleet(t, 1, 1, `[{"id":"api","limit":1000,"window":"1s"}]`)
	f.svc.NoPenalty = true
	f.tick(100)
	admitted := 0
	for ms := 0; ms < 3000; ms++ {
		for range 20 { // 20,000 requests a second against 1,000
			if f.send(0, 0, "hot").Admitted() {
				admitted++
			}
		}
		f.tick(1)
	}
	acquires := f.gws[0].Metric("tollgate.acquires")
	t.Logf("3 s at 20x the limit: %d admitted, %d acquires, %d batches", admitted, acquires, f.svc.Batches)
	// The bucket's 1,000 at once, then 1,000 a second.
	if admitted < 3800 || admitted > 4000 {
		t.Errorf("%d admitted in 3 s, want about 4,000 (capacity 1,000 + 3,000 refill)", admitted)
	}
	if acquires > 60 {
		t.Errorf("%d acquires in 3 s, want at most about one per 100 ms interval (30) and a few more", acquires)
	}
}

// A sync that is slow — its reply takes 240 ms, within the callout's timeout (250 ms),
// while the service answers everything else (a busy Redis, a loaded host) — is not a
// failure: the leader asks the service's liveness probe while the sync waits, and the answers
// keep the gateway healthy (no degraded answer, the breaker gauge stays 0). The same
// sync unanswered by a service that answers nothing (hung) makes every worker degraded
// within two intervals and a quarter, as before; syncs that fail (500) or time out (the
// host's 504) open the breaker after breaker_failures (3) of them, probes answered or
// not.
func TestSlowSyncIsNotAFailure(t *testing.T) {
	for _, mode := range []string{"slow", "hung", "failing", "timing out"} {
		t.Run(mode, func(t *testing.T) {
			f := newFleet(t, 1, 2, `[{"id":"api","limit":100000,"window":"1m"}]`)
			h := f.gws[0]
			f.tick(100)
			f.send(0, 0, "k")
			var held []*nativehost.Callout // the slow sync and its hedge
			var sentAt int64
			syncs := 0
			// answer answers the waiting callouts as the mode's service does.
			answer := func() {
				for _, c := range h.TakeCallouts() {
					path := c.Header(":path")
					switch {
					case mode == "hung":
						// nothing answers (the callouts would time out after 250 ms)
					case path == wire.AlivePath || path == "/v1/check":
						status, body := f.svc.Handle(path, c.Body, f.now)
						h.Respond(c, [][2]string{{":status", strconv.Itoa(status)}}, body)
					case mode == "failing":
						syncs++
						h.Respond(c, [][2]string{{":status", "500"}}, []byte("internal error"))
					case mode == "timing out":
						syncs++
						h.Fail(c, true)
					default:
						if held == nil {
							sentAt = f.now
						}
						held = append(held, c) // answered below
					}
				}
			}
			degradedAt := int64(-1)
			start := f.now
			for step := 1; step <= 40; step++ { // 1 s in 25 ms ticks
				f.now += 25_000
				for w := range h.Workers() {
					h.Tick(w)
				}
				answer()
				if held != nil && f.now-sentAt >= 240_000 {
					for _, c := range held {
						status, body := f.svc.Handle("/v1/sync", c.Body, f.now)
						h.Respond(c, [][2]string{{":status", strconv.Itoa(status)}}, body)
					}
					held = nil
					answer()
				}
				for w := range h.Workers() {
					s := h.Request(w, [][2]string{{":method", "GET"}, {":path", "/api"}, {":authority", "a"}, {"x-api-key", "k"}}, nil)
					answer()
					if s.Header("x-ratelimit-policy") == "degraded" && degradedAt < 0 {
						degradedAt = f.now - start
					}
				}
			}
			t.Logf("%s: first degraded answer at %.0f ms (negative: none); syncs failed %d, sync_failed %d", mode, float64(degradedAt)/1000, syncs, h.Metric("tollgate.sync_failed"))
			switch mode {
			case "slow":
				if degradedAt >= 0 {
					t.Fatalf("a sync answered after 240 ms, the service answering probes meanwhile: degraded answer at %d ms", degradedAt/1000)
				}
				if n := h.Metric("tollgate.breaker_state"); n != 0 {
					t.Fatalf("breaker_state %d after a slow sync", n)
				}
				if n := h.Metric("tollgate.sync_failed"); n != 0 {
					t.Fatalf("sync_failed %d: a slow sync is not a failure", n)
				}
			case "hung":
				if degradedAt < 0 || degradedAt > 100_000+225_000 {
					t.Fatalf("hung service: first degraded answer at %d ms, want within 2.25 intervals of the first unanswered sync (sent at 100 ms)", degradedAt/1000)
				}
			default:
				if degradedAt < 0 {
					t.Fatalf("%s syncs (%d): never degraded", mode, syncs)
				}
				if syncs < 3 {
					t.Fatalf("degraded after %d failed syncs, want breaker_failures (3)", syncs)
				}
			}
		})
	}
}

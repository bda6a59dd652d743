package plugin_test

import (
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/nativehost"
	"github.com/tollgate-rl/tollgate/internal/memservice"
	"github.com/tollgate-rl/tollgate/shared/lease"
)

const (
	cfgInFlight = `{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
		"rules":[{"id":"llm","match":{"prefix":"/v1/chat"},"max_in_flight":3}]}`
	// cfgInFlightRate caps concurrency and rate on one rule.
	cfgInFlightRate = `{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
		"rules":[{"id":"export","limit":3,"window":"1m","max_in_flight":2}]}`
)

// fleetGateway is one gateway of several workers on the virtual clock.
type fleetGateway struct {
	t   *testing.T
	now *int64
	h   *nativehost.Host
}

func newWorkers(t *testing.T, config string, workers int, now *int64, seed uint64) *fleetGateway {
	t.Helper()
	h, err := nativehost.New(nativehost.Config{Workers: workers, PluginConfig: []byte(config), Clock: func() int64 { return *now }, Seed: seed})
	if err != nil {
		t.Fatalf("starting the plugin: %v", err)
	}
	return &fleetGateway{t: t, now: now, h: h}
}

// open starts a request on worker w for key whose upstream answers when the test says.
func (g *fleetGateway) open(w int, path, key string) *nativehost.Stream {
	req := [][2]string{{":method", "POST"}, {":path", path}, {":authority", "api.example.com"}, {"x-api-key", key}}
	return g.h.Open(w, req, map[string]string{"source.address": "10.1.2.3:50000"})
}

// burst opens n requests for key, round robin over the workers, and returns those
// admitted and how many were refused with 429.
func (g *fleetGateway) burst(n int, path, key string) (admitted []*nativehost.Stream, refused int) {
	g.t.Helper()
	for i := range n {
		s := g.open(i%len(g.h.Workers()), path, key)
		switch {
		case s.Admitted():
			admitted = append(admitted, s)
		case s.Status() == 429:
			refused++
		default:
			g.t.Fatalf("request %d: %s", i, answer(s))
		}
	}
	return admitted, refused
}

func (g *fleetGateway) tickAll() {
	for w := range g.h.Workers() {
		g.h.Tick(w)
	}
}

// TestInFlightTakeAndReturn: a key has at most max_in_flight requests open; the next is
// refused with 429 naming the rule and concurrency; ending one (however it ends) lets
// the next in; other keys and routes are not affected.
func TestInFlightTakeAndReturn(t *testing.T) {
	now := int64(t0)
	g := newWorkers(t, cfgInFlight, 1, &now, 1)
	admitted, refused := g.burst(3, "/v1/chat", "k1")
	if len(admitted) != 3 || refused != 0 {
		t.Fatalf("first three: %d admitted, %d refused", len(admitted), refused)
	}
	s := g.open(0, "/v1/chat", "k1")
	const want429 = `429 | retry-after: 1 | x-ratelimit-rule: llm | x-ratelimit-concurrency-limit: 3 | body {"error":{"code":"CONCURRENCY_LIMIT_EXCEEDED","message":"Concurrency limit of 3 requests in flight exceeded","details":{"reason":"concurrency","max_in_flight":3,"retry_after_seconds":1,"rule":"llm"}}}`
	if got := answer(s); got != want429 {
		t.Errorf("fourth request:\n got %s\nwant %s", got, want429)
	}
	if !s.Ended {
		t.Error("a refused request's stream did not end")
	}
	if got := answer(g.open(0, "/v1/chat", "k2")); got != "200" {
		t.Errorf("another key: %s, want 200 (no headers: the rule has no rate limit)", got)
	}
	if got := answer(g.open(0, "/v1/other", "k1")); got != "200" {
		t.Errorf("another route: %s", got)
	}
	for _, end := range []struct {
		name string
		end  func(*nativehost.Stream)
	}{
		{"response", g.h.End},
		{"reset", g.h.Reset},
	} {
		t.Run(end.name, func(t *testing.T) {
			end.end(admitted[0])
			admitted = admitted[1:]
			s := g.open(0, "/v1/chat", "k1")
			if !s.Admitted() {
				t.Fatalf("after one ended: %s", answer(s))
			}
			admitted = append(admitted, s)
			if s := g.open(0, "/v1/chat", "k1"); s.Status() != 429 {
				t.Fatalf("with three open again: %s", answer(s))
			}
		})
	}
	if got := g.h.Metric("tollgate.requests_concurrency_limited"); got != 3 {
		t.Errorf("requests_concurrency_limited %d, want 3", got)
	}
}

// TestInFlightAcrossWorkers: the count is the gateway's, in shared data: slots taken on
// one worker count on every other, and a slot given back on one frees it for all.
func TestInFlightAcrossWorkers(t *testing.T) {
	now := int64(t0)
	g := newWorkers(t, cfgInFlight, 4, &now, 7)
	admitted, refused := g.burst(40, "/v1/chat", "k1")
	if len(admitted) != 3 || refused != 37 {
		t.Fatalf("40 over 4 workers: %d admitted, %d refused; want 3, 37", len(admitted), refused)
	}
	g.h.End(admitted[2]) // taken on worker 2
	for w := range 4 {
		if w == 2 {
			continue
		}
		s := g.open(w, "/v1/chat", "k1")
		if !s.Admitted() {
			t.Fatalf("worker %d after worker 2's request ended: %s", w, answer(s))
		}
		g.h.Reset(s)
	}
}

// TestInFlightStreamsReturnSlots: every way a stream ends gives its slot back — the
// response, the router's 504 on an upstream timeout (a local reply through the
// response path), a client reset of an admitted request, a reset while the request is
// paused for the sync service, and a request the rate limit refuses — so after each
// round a burst is admitted max_in_flight times again.
func TestInFlightStreamsReturnSlots(t *testing.T) {
	now := int64(t0)
	cfg := `{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
		"sync":{"cluster":"svc","interval_ms":100},
		"rules":[{"id":"llm","match":{"prefix":"/v1/chat"},"max_in_flight":5},
		         {"id":"strict","match":{"prefix":"/v1/chat/strict"},"strict":true,"limit":1000,"window":"1m"}]}`
	g := newWorkers(t, cfg, 2, &now, 3)
	for round, end := range []struct {
		name string
		path string
		end  func(*nativehost.Stream)
	}{
		{"response", "/v1/chat", g.h.End},
		{"upstream timeout", "/v1/chat", g.h.End},
		{"client reset", "/v1/chat", g.h.Reset},
		{"reset while paused", "/v1/chat/strict", g.h.Reset},
	} {
		t.Run(end.name, func(t *testing.T) {
			var open []*nativehost.Stream
			for i := range 12 {
				s := g.open(i%2, end.path, "k1")
				if s.Admitted() || s.Paused {
					open = append(open, s)
				} else if s.Status() != 429 {
					t.Fatalf("round %d request %d: %s", round, i, answer(s))
				}
			}
			if len(open) != 5 {
				t.Fatalf("%d requests in flight, want 5", len(open))
			}
			for _, s := range open {
				end.end(s)
			}
			if n := len(g.h.Callouts()); end.path == "/v1/chat/strict" && n == 0 {
				t.Fatal("the strict requests did not wait for the service")
			}
			g.h.TakeCallouts() // their answers would find no stream
		})
	}
	// A paused request the service then refuses gives its slot back at once.
	s := g.open(0, "/v1/chat/strict", "k2")
	cs := g.h.TakeCallouts()
	if !s.Paused || len(cs) != 1 {
		t.Fatalf("strict request: paused %v, %d callouts", s.Paused, len(cs))
	}
	for ; len(cs) > 0; cs = g.h.TakeCallouts() { // the service is unreachable (resends too)
		for _, c := range cs {
			g.h.Fail(c, false)
		}
	}
	if !s.Open { // decided degraded, admitted
		t.Fatalf("strict request after a failed check: %s", answer(s))
	}
	g.h.End(s)
	admitted, _ := g.burst(12, "/v1/chat", "k1")
	if len(admitted) != 5 {
		t.Fatalf("after every round: %d admitted, want 5", len(admitted))
	}
}

// TestInFlightWithRateLimit: max_in_flight and the rate limit both apply; a request
// refused for concurrency spends no permit, and one the rate limit refuses holds no slot.
func TestInFlightWithRateLimit(t *testing.T) {
	now := int64(t0)
	g := newWorkers(t, cfgInFlightRate, 1, &now, 1)
	a := g.open(0, "/x", "k1")
	b := g.open(0, "/x", "k1")
	c := g.open(0, "/x", "k1")
	if !a.Admitted() || !b.Admitted() || c.Status() != 429 || c.Header("x-ratelimit-concurrency-limit") != "2" {
		t.Fatalf("three at once: %s / %s / %s", answer(a), answer(b), answer(c))
	}
	g.h.End(b) // its headers go out with the response
	if got := b.Header("x-ratelimit-remaining"); got != "1" {
		t.Errorf("remaining after two admitted: %q, want 1 (the concurrency refusal spent none)", got)
	}
	d := g.open(0, "/x", "k1") // the third permit
	if !d.Admitted() {
		t.Fatalf("third permit: %s", answer(d))
	}
	g.h.End(a)
	g.h.End(d)
	e := g.open(0, "/x", "k1") // no permit left: a rate-limit refusal
	if e.Status() != 429 || e.Header("x-ratelimit-concurrency-limit") != "" {
		t.Fatalf("fourth permit: %s", answer(e))
	}
	now += 40_000_000 // two permits back
	f1, f2 := g.open(0, "/x", "k1"), g.open(0, "/x", "k1")
	if !f1.Admitted() || !f2.Admitted() {
		t.Fatalf("after the refill: %s / %s (the refused request kept a slot?)", answer(f1), answer(f2))
	}
}

// TestInFlightDeadVMReclaimed: a worker VM restarted under its open requests never
// gives their slots back; they block the key until its beat is holderStaleUs (10 s)
// old, and not after: the next request then drops them.
func TestInFlightDeadVMReclaimed(t *testing.T) {
	now := int64(t0)
	g := newWorkers(t, cfgInFlight, 2, &now, 5)
	var stuck []*nativehost.Stream
	for range 3 {
		s := g.open(1, "/v1/chat", "k1")
		if !s.Admitted() {
			t.Fatalf("worker 1: %s", answer(s))
		}
		stuck = append(stuck, s)
	}
	// Worker 1 lives on for two seconds (beating on its ticks), then its VM dies.
	for range 2 {
		now += 1_000_000
		g.tickAll()
	}
	died := now
	if err := g.h.Restart(1); err != nil {
		t.Fatal(err)
	}
	for _, s := range stuck {
		if !s.Ended {
			t.Fatal("a stream of the dead VM is still open")
		}
	}
	for _, tc := range []struct {
		afterMs int64
		admit   bool
	}{
		{0, false},
		{5_000, false},
		{9_000, false}, // the dead VM's last beat was 9 s ago
		{10_000, true}, // 10 s after the death the beat is stale whenever it was
	} {
		t.Run(strconv.FormatInt(tc.afterMs, 10)+"ms", func(t *testing.T) {
			for now < died+tc.afterMs*1000 {
				now = min(now+1_000_000, died+tc.afterMs*1000)
				g.tickAll()
			}
			w := int(tc.afterMs/1000) % 2 // either worker, the new VM too
			s := g.open(w, "/v1/chat", "k1")
			if s.Admitted() != tc.admit {
				t.Fatalf("admitted %v, want %v: %s", s.Admitted(), tc.admit, answer(s))
			}
			if s.Admitted() {
				g.h.End(s)
			}
		})
	}
	admitted, _ := g.burst(10, "/v1/chat", "k1")
	if len(admitted) != 3 {
		t.Errorf("after the reclaim: %d admitted, want 3", len(admitted))
	}
	if got := g.h.Metric("tollgate.concurrency_slots_reclaimed"); got != 3 {
		t.Errorf("concurrency_slots_reclaimed %d, want 3", got)
	}
}

// TestInFlightLiveWorkersKeepSlots: a worker that keeps beating keeps its slots however
// long its requests run (a minute-long stream is not taken for a dead VM's).
func TestInFlightLiveWorkersKeepSlots(t *testing.T) {
	now := int64(t0)
	g := newWorkers(t, cfgInFlight, 2, &now, 9)
	admitted, _ := g.burst(3, "/v1/chat", "k1")
	if len(admitted) != 3 {
		t.Fatalf("%d admitted", len(admitted))
	}
	for range 60 {
		now += 1_000_000
		g.tickAll()
		if s := g.open(0, "/v1/chat", "k1"); s.Status() != 429 {
			t.Fatalf("at %d s: %s", (now-t0)/1_000_000, answer(s))
		}
	}
	if got := g.h.Metric("tollgate.concurrency_slots_reclaimed"); got != 0 {
		t.Errorf("concurrency_slots_reclaimed %d, want 0", got)
	}
}

// TestInFlightFleetShare: with the sync service, each of N gateways admits
// ceil(max_in_flight / N) per key (the fleet size from the sync replies), so the fleet
// admits at most max_in_flight + N - 1; before the first reply a gateway assumes
// expected_nodes.
func TestInFlightFleetShare(t *testing.T) {
	now := int64(t0)
	svc := memservice.New(lease.SyncConfig{})
	cfg := func(node string) string {
		return `{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
		"sync":{"cluster":"svc","interval_ms":100,"node":"` + node + `"},
		"rules":[{"id":"llm","match":{"prefix":"/v1/chat"},"max_in_flight":10},{"id":"api","match":{"prefix":"/x"},"limit":100000,"window":"1s"}]}`
	}
	var gws []*fleetGateway
	for i := range 4 {
		gws = append(gws, newWorkers(t, cfg("gw-"+strconv.Itoa(i)), 2, &now, uint64(10+i)))
	}
	deliver := func() {
		for _, g := range gws {
			for cs := g.h.TakeCallouts(); len(cs) > 0; cs = g.h.TakeCallouts() {
				for _, c := range cs {
					status, body := svc.Handle(c.Header(":path"), c.Body, now)
					g.h.Respond(c, [][2]string{{":status", strconv.Itoa(status)}}, body)
				}
			}
		}
	}
	total := 0
	for i, g := range gws {
		admitted, _ := g.burst(20, "/v1/chat", "before-sync-"+strconv.Itoa(i))
		if len(admitted) != 10 {
			t.Errorf("gateway %d before its first reply: %d admitted, want 10 (expected_nodes 1)", i, len(admitted))
		}
	}
	// Every gateway syncs (its requests on the api rule make deltas) and learns the fleet:
	// the service counts a gateway once its syncs span a second (backend.DefaultFleetProbation)
	// and refreshes the count once a second, so three seconds of syncs.
	for range 30 {
		for _, g := range gws {
			g.open(0, "/x", "k")
		}
		for range 4 {
			now += 25_000
			for _, g := range gws {
				g.tickAll()
			}
			deliver()
		}
	}
	for i, g := range gws {
		admitted, refused := g.burst(20, "/v1/chat", "k1")
		if len(admitted) != 3 || refused != 17 {
			t.Errorf("gateway %d: %d admitted, %d refused; want ceil(10/4) = 3", i, len(admitted), refused)
		}
		if s := g.open(0, "/v1/chat", "k1"); s.Header("x-ratelimit-concurrency-limit") != "3" {
			t.Errorf("gateway %d refusal: %s", i, answer(s))
		}
		total += len(admitted)
	}
	if total > 10+4-1 {
		t.Errorf("fleet admitted %d in flight, bound %d", total, 10+4-1)
	}
}

// TestInFlightSharedDataFailing: while shared data fails, a rule's max_in_flight is
// decided by its fail mode (open: admitted uncounted; closed: 503) and counted in
// concurrency_failures; a slot whose release failed is given back on a later tick.
func TestInFlightSharedDataFailing(t *testing.T) {
	now := int64(t0)
	var failing atomic.Bool
	h, err := nativehost.New(nativehost.Config{Workers: 1, Clock: func() int64 { return now }, Seed: 1,
		PluginConfig: []byte(`{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,"rules":[
			{"id":"llm","match":{"prefix":"/v1/chat"},"max_in_flight":1},
			{"id":"pay","match":{"prefix":"/v1/pay"},"max_in_flight":1,"fail":"closed"}]}`),
		SharedFault: func(key string) error {
			if failing.Load() && (strings.HasPrefix(key, "tg:f:") || key == "tg:live") {
				return errors.New("shared data unavailable")
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	g := &fleetGateway{t: t, now: &now, h: h}
	held := g.open(0, "/v1/chat", "k1") // taken while shared data works
	if !held.Admitted() {
		t.Fatalf("first request: %s", answer(held))
	}
	failing.Store(true)
	for _, tc := range []struct {
		path, want string
	}{
		{"/v1/chat", "200"}, // fail open: admitted without a slot
		{"/v1/pay", `503 | x-ratelimit-remaining: -1 | x-ratelimit-policy: degraded | retry-after: 1 | x-ratelimit-rule: pay | body {"error":{"code":"RATE_LIMITER_UNAVAILABLE","message":"Rate limiter is temporarily unavailable","details":{"retry_after_seconds":1,"rule":"pay"}}}`},
	} {
		t.Run(tc.path, func(t *testing.T) {
			s := g.open(0, tc.path, "k1")
			if got := answer(s); got != tc.want {
				t.Errorf("\n got %s\nwant %s", got, tc.want)
			}
			h.End(s)
		})
	}
	if got := h.Metric("tollgate.concurrency_failures"); got != 2 {
		t.Errorf("concurrency_failures %d, want 2", got)
	}
	h.End(held) // its release fails: kept for the tick
	failing.Store(false)
	if s := g.open(0, "/v1/chat", "k1"); s.Status() != 429 {
		t.Fatalf("before the tick: %s (the failed release was lost?)", answer(s))
	}
	now += 1_000_000
	h.Tick(0)
	if s := g.open(0, "/v1/chat", "k1"); !s.Admitted() {
		t.Fatalf("after the tick: %s", answer(s))
	}
}

// TestInFlightGRPC: a gRPC request refused for concurrency gets RESOURCE_EXHAUSTED.
func TestInFlightGRPC(t *testing.T) {
	now := int64(t0)
	g := newWorkers(t, cfgInFlight, 1, &now, 1)
	req := [][2]string{{":method", "POST"}, {":path", "/v1/chat/Stream"}, {":authority", "api.example.com"},
		{"content-type", "application/grpc"}, {"x-api-key", "k1"}}
	var last *nativehost.Stream
	for range 4 {
		last = g.h.Open(0, req, nil)
	}
	if last.Local == nil || last.Local.Status != 429 || last.Local.GRPCStatus != 8 ||
		string(last.Local.Body) != "concurrency limited by rule llm; retry after 1 s" {
		t.Fatalf("fourth gRPC request: %d, grpc-status %d, %q", last.Local.Status, last.Local.GRPCStatus, last.Local.Body)
	}
}

// TestInFlightRecordsReused: records are never deleted (shared-data keys cannot be), so
// the table stays bounded by taking over records with nothing in flight: 40,000 callers
// one after the other through a 16,384-record table are all admitted and counted (a
// caller whose 8 probes found no record to take would be admitted uncounted, a
// concurrency failure), and a caller with requests in flight keeps its record.
func TestInFlightRecordsReused(t *testing.T) {
	now := int64(t0)
	g := newWorkers(t, cfgInFlight, 2, &now, 11)
	busy, _ := g.burst(3, "/v1/chat", "busy")
	for i := range 40_000 {
		s := g.open(i%2, "/v1/chat", "caller-"+strconv.Itoa(i))
		if !s.Admitted() {
			t.Fatalf("caller %d: %s", i, answer(s))
		}
		g.h.End(s)
	}
	if s := g.open(0, "/v1/chat", "busy"); s.Status() != 429 || len(busy) != 3 {
		t.Errorf("the busy caller after the flood (%d held): %s", len(busy), answer(s))
	}
	if got := g.h.Metric("tollgate.concurrency_failures"); got != 0 {
		t.Errorf("concurrency_failures %d", got)
	}
}

//go:build !wasip1

// The host tests start processes and listeners (Redis, the sync service, wazero VMs):
// they run on the build machine, never inside a wasip1 module.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/wasmtest"
	"github.com/tollgate-rl/tollgate/internal/redistest"
	wasmhost "github.com/tollgate-rl/tollgate/internal/wazerohost"
	"github.com/tollgate-rl/tollgate/ratelimit/service"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
)

// These tests run the compiled filter in our own proxy-wasm host (internal/wazerohost), which does
// what the SDK's emulator cannot: several worker VMs sharing one shared-data store with
// Envoy's CAS rules, real concurrency, real callouts to the real sync service in front of
// real Redis, and millions of requests through the ABI.

// newGateway starts a Host running the compiled filter and closes it when the test ends.
func newGateway(t *testing.T, cfg wasmhost.Config) *wasmhost.Host {
	t.Helper()
	cfg.Wasm = wasmtest.FilterWasm(t)
	if cfg.Upstream == nil {
		cfg.Upstream = wasmhost.StaticUpstream(200, nil, []byte("ok"))
	}
	if cfg.LogLevel == 0 {
		cfg.LogLevel = 2 // info: the filter's debug lines would only fill the ring
	}
	h, err := wasmhost.New(cfg)
	if err != nil {
		t.Fatalf("starting the filter: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("closing the gateway: %v", err)
		}
	})
	return h
}

func keyRequest(path, key string) *wasmhost.Request {
	return &wasmhost.Request{Method: "GET", Path: path, Authority: "api.example.com",
		Header: []wasmhost.Pair{{"x-api-key", key}}, RemoteAddr: "10.1.2.3:40000"}
}

// checkAnswer fails the test unless r is a 200 or a 429 carrying the rate-limit headers
// (a 429 also its Retry-After).
func checkAnswer(t *testing.T, r *wasmhost.Response) {
	t.Helper()
	if r.Status != 200 && r.Status != 429 {
		t.Errorf("status %d (local %v, %q): %s", r.Status, r.Local, r.Details, r.Body)
		return
	}
	for _, h := range []string{"x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "ratelimit-policy"} {
		if r.Get(h) == "" {
			t.Errorf("%d answer without %s: %v", r.Status, h, r.Header)
		}
	}
	if r.Status == 429 {
		if s, err := strconv.Atoi(r.Get("retry-after")); err != nil || s < 1 {
			t.Errorf("429 with retry-after %q", r.Get("retry-after"))
		}
	}
}

// metricDelta reads counters before and after a phase.
type metricDelta map[string]int64

func (before metricDelta) since(h *wasmhost.Host, name string) int64 {
	return h.Metrics()["tollgate."+name] - before["tollgate."+name]
}

// mustHold is a hard assertion that names the property it checks.
func mustHold(t *testing.T, ok bool, what, format string, args ...any) {
	t.Helper()
	if !ok {
		t.Errorf("%s: %s", what, fmt.Sprintf(format, args...))
	}
}

// midHourClock is the real clock moved to 30 minutes into an hour, so windows aligned
// to the epoch (fixed and sliding-counter windows of 1 h) cannot roll over during a test.
func midHourClock() func() time.Time {
	now := time.Now()
	base := now.Truncate(time.Hour).Add(30 * time.Minute)
	return func() time.Time { return base.Add(time.Since(now)) }
}

// Two worker VMs of one gateway decide against one bucket in shared data. 400 requests
// for one key race on both workers at once; every algorithm admits exactly its capacity,
// and each admitted request saw a different remaining count (two workers admitting from
// the same state would repeat one). The one documented exception: a request that ran out
// of CAS attempts is admitted (cas_retry_exhausted, see maxCASAttempts in
// filter/plugin/plugin.go). The race includes the bucket's creation: Envoy cannot create
// a key conditionally, and an unconditional create lost every update the other worker
// made meanwhile (up to 15 extra admissions in 400 here) until table.store created slots
// with a fence CAS.
func TestHostWorkersShareOneBucket(t *testing.T) {
	const limit, workers, requests = 50, 2, 400
	algorithms := []string{"token_bucket", "gcra", "sliding_window_log", "sliding_window_counter", "fixed_window"}
	var rules []string
	for _, a := range algorithms {
		rules = append(rules, fmt.Sprintf(`{"id":%q,"match":{"prefix":"/%s"},"algorithm":%q,"limit":%d,"window":"1h"}`, a, a, a, limit))
	}
	stopped := midHourClock()()
	h := newGateway(t, wasmhost.Config{
		Workers:      workers,
		PluginConfig: []byte(`{"key":{"source":"header","name":"x-api-key"},"rules":[` + strings.Join(rules, ",") + `]}`),
		// A stopped clock: every request decides at the same instant, so the remaining
		// counts are exact. (With a running clock a request that read the time before
		// another but reached the bucket after it sees a fraction more used, and a
		// GCRA-style state rounds that up: the header is one lower, the bucket right.)
		Clock: func() time.Time { return stopped },
	})
	for _, algorithm := range algorithms {
		t.Run(algorithm, func(t *testing.T) {
			before := metricDelta(h.Metrics())
			var admitted, rejected atomic.Int64
			var mu sync.Mutex
			seen := map[string]int{} // x-ratelimit-remaining of admitted requests
			var wg sync.WaitGroup
			for i := 0; i < requests; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := h.HandleOn(i%workers, keyRequest("/"+algorithm, "bot-"+algorithm))
					checkAnswer(t, r)
					switch r.Status {
					case 200:
						admitted.Add(1)
						mu.Lock()
						seen[r.Get("x-ratelimit-remaining")]++
						mu.Unlock()
					case 429:
						rejected.Add(1)
					}
				}()
			}
			wg.Wait()
			exhausted := before.since(h, "cas_retry_exhausted")
			got := admitted.Load()
			if exhausted > 0 {
				t.Logf("%d requests ran out of CAS attempts (admitted by design)", exhausted)
			}
			if got < limit || got > limit+exhausted {
				t.Fatalf("admitted %d of %d, want %d (+ %d CAS-exhausted)", got, requests, limit, exhausted)
			}
			if got == limit && exhausted == 0 {
				for n := 0; n < limit; n++ {
					if c := seen[strconv.Itoa(n)]; c != 1 {
						t.Fatalf("x-ratelimit-remaining %d seen on %d admitted answers, want 1 (remaining seen: %v)", n, c, seen)
					}
				}
			}
			if a, r := before.since(h, "requests_allowed"), before.since(h, "requests_rejected"); a != got || r != rejected.Load() {
				t.Fatalf("metrics say %d allowed, %d rejected; answers %d, %d", a, r, got, rejected.Load())
			}
		})
	}
}

// fleet is a sync service on a loopback listener in front of a real standalone Redis,
// and two gateways of two workers each, with their own shared data, syncing to it.
type fleet struct {
	t      *testing.T
	st     *store.Store
	url    string
	gws    [2]*wasmhost.Host
	limit  int
	gateMu sync.RWMutex // held: sync requests wait (a slow service, on demand)
}

const (
	fleetSecret = "s3cret"
	fleetAdmin  = "adm1n"
	fleetLimit  = 100
)

func startFleet(t *testing.T) *fleet {
	t.Helper()
	rs := redistest.StartStandalone(t)
	store.RouteRedisLogs(slog.New(slog.DiscardHandler))
	m := service.NewMetrics()
	st, err := store.Open(store.Config{Addrs: rs.Addrs()}, m)
	if err != nil {
		t.Fatalf("store: %v", err)
	}
	svc := service.New(service.Config{SyncSecret: fleetSecret, AdminToken: fleetAdmin, Logger: slog.New(slog.DiscardHandler)}, st, m)
	f := &fleet{t: t, st: st, limit: fleetLimit}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/sync" {
			f.gateMu.RLock()
			defer f.gateMu.RUnlock()
		}
		svc.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		hs.Close()
		_ = st.Close()
	})
	f.url = hs.URL
	addr := strings.TrimPrefix(hs.URL, "http://")
	for i, node := range []string{"gw-a", "gw-b"} {
		// A long callout timeout so that holding syncs delays them instead of failing
		// them; retry_jitter_ms 0 so Retry-After is exactly what the filter decided;
		// stale_ms 200 so that Redis has every admission within a fraction of a second
		// (settle). No node id: each gateway takes Envoy's node.id, as shipped.
		cfg := `{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
			"sync":{"cluster":"tollgate_ratelimit","authority":"ratelimit","secret":"` + fleetSecret + `",
				"interval_ms":100,"timeout_ms":3000,"stale_ms":200},
			"rules":[{"id":"api","limit":` + strconv.Itoa(fleetLimit) + `,"window":"1h"}]}`
		f.gws[i] = newGateway(t, wasmhost.Config{
			Workers: 2, NodeID: node, PluginConfig: []byte(cfg),
			Clusters: map[string][]string{"tollgate_ratelimit": {addr}},
		})
	}
	return f
}

// usage is the service's view of one key's bucket, through the admin API.
type usage struct {
	Remaining, Outstanding int64
	PenaltyLevel           int64
}

func (f *fleet) usage(key string) usage {
	f.t.Helper()
	req, err := http.NewRequest(http.MethodGet, f.url+"/v1/usage/"+key, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+fleetAdmin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatalf("GET /v1/usage/%s: %v", key, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		f.t.Fatalf("GET /v1/usage/%s: %d %s", key, resp.StatusCode, body)
	}
	var u store.Usage
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&u); err != nil {
		f.t.Fatalf("usage body %s: %v", body, err)
	}
	out := usage{PenaltyLevel: u.Penalty.Level, Remaining: int64(f.limit)}
	for _, b := range u.Buckets {
		out.Remaining, out.Outstanding = b.Remaining, b.Outstanding
	}
	return out
}

// consumed is what Redis has charged for the key: the limit less what is left and what
// is reserved as leases (RATIONALE §2 invariant). Exact while the 1 h bucket has refilled
// less than one permit (a test lasts seconds; one permit takes 36 s).
func (u usage) consumed(limit int) int64 { return int64(limit) - u.Remaining - u.Outstanding }

// settle waits until Redis has charged exactly what the gateways admitted, and still has
// three sync intervals later (no batch was still on its way). The wait is bounded; only a
// mismatch that never resolves fails.
func (f *fleet) settle(key string, admitted int64) usage {
	f.t.Helper()
	var u usage
	deadline := time.Now().Add(10 * time.Second)
	for {
		u = f.usage(key)
		if u.consumed(f.limit) == admitted {
			time.Sleep(300 * time.Millisecond)
			if u2 := f.usage(key); u2.consumed(f.limit) == admitted {
				return u2
			}
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("Redis charged %d for %q (remaining %d, leases %d), the gateways admitted %d", u.consumed(f.limit), key, u.Remaining, u.Outstanding, admitted)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// send runs n sequential requests for key on gateway g, alternating its workers, with
// pause between them, and returns the answers.
func (f *fleet) send(g, n int, key string, pause time.Duration) []*wasmhost.Response {
	out := make([]*wasmhost.Response, n)
	for i := range out {
		out[i] = f.gws[g].HandleOn(i%2, keyRequest("/orders", key))
		checkAnswer(f.t, out[i])
		time.Sleep(pause)
	}
	return out
}

func count(rs []*wasmhost.Response, status int) (n int64) {
	for _, r := range rs {
		if r.Status == status {
			n++
		}
	}
	return n
}

// One quota across gateways (DESIGN requirement 9, RATIONALE §3), against the real
// service and Redis.
func TestHostFleetOneQuota(t *testing.T) {
	f := startFleet(t)

	// Eight clients — two per worker of each gateway — each send requests one after the
	// other, with a pause between them or none, for a key of their own: cold starts,
	// reservations, leases and acquires all happen during the run.
	spread := []struct {
		name      string
		perClient int
		pause     time.Duration
	}{
		{"paced", 150, time.Millisecond}, // about two sync intervals
		{"back_to_back", 60, 0},          // mostly inside the first round trip
	}
	for _, tt := range spread {
		t.Run("spread_"+tt.name, func(t *testing.T) {
			const clients = 8
			key := "fleet-spread-" + tt.name
			var admitted atomic.Int64
			var perGateway [2]atomic.Int64
			var wg sync.WaitGroup
			for c := 0; c < clients; c++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					g, w := c%2, (c/2)%2
					for i := 0; i < tt.perClient; i++ {
						r := f.gws[g].HandleOn(w, keyRequest("/orders", key))
						checkAnswer(t, r)
						if r.Status == 200 {
							admitted.Add(1)
							perGateway[g].Add(1)
						}
						time.Sleep(tt.pause)
					}
				}()
			}
			wg.Wait()
			got := admitted.Load()
			u := f.settle(key, got)
			t.Logf("admitted %d (gw-a %d, gw-b %d) of %d requests, limit %d; Redis: remaining %d, leases %d",
				got, perGateway[0].Load(), perGateway[1].Load(), clients*tt.perClient, f.limit, u.Remaining, u.Outstanding)
			// False rejections: with demand far above the limit for the whole run, the only
			// permits left unused may be leases the service reserved for a gateway
			// (RATIONALE §3: the permits a request needs reserved elsewhere).
			if got < int64(f.limit)-u.Outstanding && u.PenaltyLevel == 0 {
				t.Errorf("admitted %d with %d permits never handed out (limit %d, leases outstanding %d)", got, u.Remaining, f.limit, u.Outstanding)
			}
			// Over-admission: leases never exceed what is unreserved, and the cold-start
			// allowances of the two gateways are at most 5 % of the limit together.
			mustHold(t, got <= int64(f.limit)*105/100, "over-admission beyond RATIONALE §3",
				"admitted %d > limit %d + 5%% (gw-a %d, gw-b %d; Redis remaining %d)",
				got, f.limit, perGateway[0].Load(), perGateway[1].Load(), u.Remaining)
		})
	}

	// A gateway with no lease for a bucket does not refuse a caller while the global
	// bucket still holds permits, even while its periodic reports wait: each request it
	// cannot cover from a lease asks the service (an acquire, one round trip), and the
	// answers bring leases. Nothing is refused, nothing is penalised, and Redis charges
	// exactly what was admitted.
	t.Run("cold_then_acquire", func(t *testing.T) {
		const key = "fleet-cold"
		f.gateMu.Lock() // the service is slow to answer reports (not acquires) until released
		first := f.send(0, 60, key, 0)
		f.gateMu.Unlock()
		admitted := count(first, 200)
		if admitted != 60 {
			t.Fatalf("admitted %d of %d while the reports waited, want all of them (acquired)", admitted, len(first))
		}
		u := f.settle(key, admitted)
		mustHold(t, u.PenaltyLevel == 0, "refusals counted toward penalties", "penalty level %d", u.PenaltyLevel)
		// After the reply the rest of the global bucket is this gateway's to use.
		more := count(f.send(0, 60, key, time.Millisecond), 200)
		u = f.settle(key, admitted+more)
		mustHold(t, admitted+more == int64(f.limit), "permits stranded or over-admitted after a cold start",
			"the gateway admitted %d + %d of a limit of %d (Redis remaining %d, leases %d)", admitted, more, f.limit, u.Remaining, u.Outstanding)
	})

	// A key exhausted through gateway A only is limited on gateway B too: one quota,
	// not one per node.
	t.Run("second_key", func(t *testing.T) {
		const key = "fleet-solo"
		// A's first request is a cold start; once it is synced A works from leases, so
		// its refusals are spent shares and the bucket drains completely, without
		// over-admission: A is the only gateway spending it.
		a := f.send(0, 1, key, 0)
		f.settle(key, count(a, 200))
		a = append(a, f.send(0, 2*f.limit, key, time.Millisecond)...)
		admittedA := count(a, 200)
		u := f.settle(key, admittedA)
		if u.Remaining > 0 || admittedA < int64(f.limit)-u.Outstanding {
			t.Fatalf("gateway A admitted %d of %d (Redis remaining %d, leases %d): the bucket should be spent", admittedA, len(a), u.Remaining, u.Outstanding)
		}
		// Gateway B has never seen the key: its first request is a cold start, and its
		// early flush brings the global state.
		b1 := f.send(1, 1, key, 0)
		u = f.settle(key, admittedA+count(b1, 200))
		b2 := f.send(1, 20, key, 0)
		if n := count(b2, 200); n != 0 {
			t.Fatalf("gateway B admitted %d of 20 after syncing a key gateway A exhausted (Redis remaining %d)", n, u.Remaining)
		}
		u = f.settle(key, admittedA+count(b1, 200))
		t.Logf("gateway A admitted %d of %d, then gateway B %d of %d; Redis: remaining %d, leases %d", admittedA, len(a), count(b1, 200)+count(b2, 200), len(b1)+len(b2), u.Remaining, u.Outstanding)

		// The key stays spent for the rest of the hour, also for a caller that pauses.
		time.Sleep(1200 * time.Millisecond)
		again := append(f.send(0, 20, key, 0), f.send(1, 20, key, 0)...)
		admittedAgain := count(again, 200)
		u = f.settle(key, admittedA+count(b1, 200)+admittedAgain)
		mustHold(t, admittedAgain == 0, "a spent key restarts cold",
			"after a 1.2 s pause the gateways admitted %d of %d for a key spent for the hour (Redis remaining %d)", admittedAgain, len(again), u.Remaining)
		// Gateway A alone, synced before its burst, works from leases and acquires and
		// its cold-start allowance, which the service charges at its next report: at
		// most the limit + 5 % (RATIONALE §3, "Cold starts").
		if admittedA > int64(f.limit)*105/100 {
			t.Errorf("gateway A alone, synced before its burst, admitted %d > limit %d + 5 %%", admittedA, f.limit)
		}
		if b1[0].Status == 200 {
			t.Logf("gateway B admitted its first request, a cold start (RATIONALE §3: within its cold-start allowance)")
		}
	})
}

// tableProbes is filter/plugin/table.go's defaultProbes: the slots a bucket may occupy.
const tableProbes = 8

// slotOf mirrors filter/plugin/table.go: a bucket id is "<rule>\x1f<window>\x1f<tier>\x1f<key>",
// hashed with FNV-1a 64 onto 1<<16 slots. The test checks the placement it relies on in
// shared data, so a change of layout fails it loudly rather than making it vacuous.
func slotOf(rule, key string) uint64 {
	id := rule + "\x1f0\x1f\x1f" + key
	h := uint64(14695981039346656037)
	for i := 0; i < len(id); i++ {
		h ^= uint64(id[i])
		h *= 1099511628211
	}
	return h % (1 << 16)
}

// keyForSlot finds a key whose bucket's home slot is want.
func keyForSlot(t *testing.T, prefix string, want uint64) string {
	t.Helper()
	for i := 0; i < 1<<24; i++ {
		k := prefix + strconv.Itoa(i)
		if slotOf("api", k) == want {
			return k
		}
	}
	t.Fatalf("no key with prefix %q lands on slot %d", prefix, want)
	return ""
}

// When every probe of a new caller's bucket is taken, the table evicts (table.go) "the
// least recently active" bucket and takes over idle ones. Here the eight slots a new caller
// may use hold one bucket in active use (49 of 50 spent a moment ago) and seven untouched
// for two hours (full again: dropping them loses nothing). Evicting the active one would
// hand its caller a fresh bucket: 50 more requests within the hour.
func TestHostEvictionSparesActiveBucket(t *testing.T) {
	const limit = 50
	var offset atomic.Int64
	clock := midHourClock()
	h := newGateway(t, wasmhost.Config{
		Workers:      1,
		PluginConfig: []byte(`{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"api","limit":50,"window":"1h"}]}`),
		Clock:        func() time.Time { return clock().Add(time.Duration(offset.Load())) },
	})
	active := "active-caller"
	home := slotOf("api", active)
	var idle []string
	for p := uint64(1); p < tableProbes; p++ {
		idle = append(idle, keyForSlot(t, "idle-", (home+p)%(1<<16)))
	}
	newcomer := keyForSlot(t, "new-", home)
	do := func(key string, n int) (admitted int) {
		for i := 0; i < n; i++ {
			r := h.HandleOn(0, keyRequest("/orders", key))
			checkAnswer(t, r)
			if r.Status == 200 {
				admitted++
			}
		}
		return admitted
	}
	for _, k := range idle {
		do(k, 1)
	}
	do(active, 1)
	for p, k := range append([]string{active}, idle...) {
		v, _, ok := h.SharedData().Get("tg:s:" + strconv.FormatUint((home+uint64(p))%(1<<16), 10))
		if !ok || !bytes.Contains(v, []byte(k)) {
			t.Fatalf("slot %d does not hold %q: the table layout changed, update slotOf", (home+uint64(p))%(1<<16), k)
		}
	}
	offset.Store(int64(2 * time.Hour)) // the idle buckets refill; the active one is used now
	if n := do(active, limit-1); n != limit-1 {
		t.Fatalf("active caller admitted %d of %d", n, limit-1)
	}
	if n := do(newcomer, 1); n != 1 {
		t.Fatalf("a new caller was refused")
	}
	got := do(active, 10)
	if got < 1 || got > 1+limit {
		t.Fatalf("active caller with 1 permit left admitted %d of 10 more", got)
	}
	mustHold(t, got <= 1, "eviction picks a bucket in use",
		"the caller that had 1 permit left was admitted %d of 10 more after a new caller took its slot", got)
}

// A request with a body is limited like any other and reaches the upstream whole. The
// module exports no request-body callback (the host skips it and goes on as after
// Continue), so nothing in the filter can hold or change the body.
func TestHostRequestBodyPassesThrough(t *testing.T) {
	body := bytes.Repeat([]byte("tollgate "), 8<<10) // 72 KB
	h := newGateway(t, wasmhost.Config{
		Workers:      1,
		PluginConfig: []byte(`{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"upload","limit":3,"window":"1h"}]}`),
		Upstream: func(_ context.Context, req *wasmhost.Request) (*wasmhost.Response, error) {
			return &wasmhost.Response{Status: 200, Body: append([]byte(nil), req.Body...)}, nil
		},
	})
	for i := range 4 {
		req := keyRequest("/v1/upload", "uploader")
		req.Method = "POST"
		req.Body = body
		r := h.Handle(req)
		checkAnswer(t, r)
		switch {
		case i < 3 && r.Status != 200:
			t.Fatalf("upload %d: status %d, want 200 (limit 3)", i, r.Status)
		case i < 3 && !bytes.Equal(r.Body, body):
			t.Fatalf("upload %d: the upstream got %d bytes back to the client, want the %d sent", i, len(r.Body), len(body))
		case i == 3 && (r.Status != 429 || !r.Local):
			t.Fatalf("upload %d: status %d (local %v), want the filter's 429", i, r.Status, r.Local)
		}
	}
}

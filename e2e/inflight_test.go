package e2e

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
)

// slowUpstream holds every request until released (or its client goes away) and counts
// how many it holds at once: what a concurrency limit protects.
type slowUpstream struct {
	URL       string
	cur, peak atomic.Int64
	seen      atomic.Int64
	mu        sync.Mutex
	gate      chan struct{} // closed: the held requests are answered
	srv       *http.Server
}

func startSlowUpstream(t *testing.T) *slowUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &slowUpstream{URL: "http://" + ln.Addr().String(), gate: make(chan struct{})}
	u.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := u.cur.Add(1)
			defer u.cur.Add(-1)
			u.seen.Add(1)
			for p := u.peak.Load(); n > p && !u.peak.CompareAndSwap(p, n); p = u.peak.Load() {
			}
			u.mu.Lock()
			gate := u.gate
			u.mu.Unlock()
			select {
			case <-gate:
				_, _ = io.WriteString(w, "done\n")
			case <-r.Context().Done():
			}
		}),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	go func() { _ = u.srv.Serve(ln) }()
	t.Cleanup(func() {
		u.release()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = u.srv.Shutdown(ctx)
	})
	return u
}

// release answers the requests held and holds the later ones again.
func (u *slowUpstream) release() {
	u.mu.Lock()
	close(u.gate)
	u.gate = make(chan struct{})
	u.mu.Unlock()
}

// burstResult is what n concurrent requests for one key got while the upstream held
// the admitted ones.
type burstResult struct {
	refused, other int
	bodies         []string // of the first refusals
	retryAfter     []string
	wait           func() []harness.Answer
}

// burst sends n concurrent requests for key spread over the gateways, each with a
// context of its own (ctx's child), and returns once every request has either been
// answered or is held at the upstream, with admittedWant true of the number that reached
// it; wait collects every answer once the held ones end.
func burst(t *testing.T, ctx context.Context, gws []*harness.Gateway, u *slowUpstream, n int, key string, admittedWant func(int64) bool) *burstResult {
	t.Helper()
	c := harness.NewClient()
	t.Cleanup(c.Close)
	answers := make([]harness.Answer, n)
	var (
		mu       sync.Mutex
		r        burstResult
		answered int64
		wg       sync.WaitGroup
	)
	seen0 := u.seen.Load()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := c.Get(ctx, gws[i%len(gws)].URL, "/v1/chat", key)
			answers[i] = a
			mu.Lock()
			defer mu.Unlock()
			answered++
			switch {
			case a.Status == http.StatusTooManyRequests:
				r.refused++
				if len(r.bodies) < 3 {
					r.bodies = append(r.bodies, string(a.Body))
					r.retryAfter = append(r.retryAfter, a.Get("Retry-After"))
				}
			case a.Err == nil && a.Status != http.StatusOK:
				r.other++
			}
		}()
	}
	err := harness.Poll(20*time.Second, 10*time.Millisecond, func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return answered+u.cur.Load() == int64(n) && admittedWant(u.seen.Load()-seen0), nil
	})
	mu.Lock()
	defer mu.Unlock()
	if err != nil {
		t.Fatalf("burst of %d: %d answered, %d at the upstream, %d reached it: %v", n, answered, u.cur.Load(), u.seen.Load()-seen0, err)
	}
	out := r
	out.bodies = append([]string(nil), r.bodies...)
	out.retryAfter = append([]string(nil), r.retryAfter...)
	out.wait = func() []harness.Answer { wg.Wait(); return answers }
	return &out
}

// TestMaxInFlight: 200 concurrent slow requests for one key through a gateway whose rule
// has max_in_flight 20: the upstream never holds more than 20 of them, the other 180 are
// refused with 429 (reason concurrency, Retry-After); when the clients give up (reset,
// or their own timeout) every slot comes back, so the next burst again gets 20 through;
// and across 4 syncing gateways the upstream never holds more than the stated fleet
// bound, max_in_flight + gateways - 1. It runs on every host (the four gateways on the
// wazero host only).
func TestMaxInFlight(t *testing.T) {
	forHostsAtOnce(t, harness.Hosts(), testMaxInFlight)
}

func testMaxInFlight(t *testing.T, host string) {
	e := sharedEnv(t)
	const maxInFlight = 20
	rules := `{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
		"rules":[{"id":"llm","match":{"prefix":"/v1/chat"},"max_in_flight":20}]}`

	t.Run("one gateway", func(t *testing.T) {
		u := startSlowUpstream(t)
		g, err := harness.StartGateway(harness.GatewayConfig{Host: host, Wasm: e.bins.Wasm, Workers: 2, NodeID: uniqueKey("inflight"),
			Rules: []byte(rules), Upstream: u.URL})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Close)
		gws := []*harness.Gateway{g}
		key := uniqueKey("llm-user")
		exactly := func(n int64) bool { return n == maxInFlight }

		for _, end := range []struct {
			name string
			end  func(cancel context.CancelFunc)
		}{
			{"client reset", func(cancel context.CancelFunc) { cancel() }},
			{"client timeout", nil}, // the burst's context has a deadline
			{"response", func(context.CancelFunc) { u.release() }},
		} {
			t.Run(end.name, func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				if end.end == nil {
					ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
				}
				defer cancel()
				peak0 := u.peak.Load()
				r := burst(t, ctx, gws, u, 200, key, exactly)
				if r.refused != 200-maxInFlight || r.other != 0 {
					t.Fatalf("%d refused with 429, %d other answers; want %d refused", r.refused, r.other, 200-maxInFlight)
				}
				for i, b := range r.bodies {
					if !strings.Contains(b, `"reason":"concurrency"`) || !strings.Contains(b, `"max_in_flight":20`) || r.retryAfter[i] != "1" {
						t.Fatalf("refusal: retry-after %q, body %s", r.retryAfter[i], b)
					}
				}
				if end.end != nil {
					end.end(cancel)
				}
				answers := r.wait()
				ok := 0
				for _, a := range answers {
					if a.Status == http.StatusOK {
						ok++
					}
				}
				if end.name == "response" && ok != maxInFlight {
					t.Errorf("%d answered 200 when the upstream answered, want %d", ok, maxInFlight)
				}
				if p := u.peak.Load(); p > maxInFlight {
					t.Fatalf("the upstream held %d requests at once (before this burst %d), max_in_flight %d", p, peak0, maxInFlight)
				}
				if err := harness.Poll(10*time.Second, 10*time.Millisecond, func() (bool, error) { return u.cur.Load() == 0, nil }); err != nil {
					t.Fatalf("the upstream still holds %d requests", u.cur.Load())
				}
			})
		}
		// After every way of ending, the slots are all back: the next burst gets 20.
		ctx, cancel := context.WithCancel(context.Background())
		r := burst(t, ctx, gws, u, 200, key, exactly)
		cancel()
		r.wait()
		if r.refused != 200-maxInFlight {
			t.Errorf("final burst: %d refused, want %d", r.refused, 200-maxInFlight)
		}
		if got := g.Metric("tollgate.requests_concurrency_limited"); got != 4*(200-maxInFlight) {
			t.Errorf("requests_concurrency_limited %d, want %d", got, 4*(200-maxInFlight))
		}
		if got := g.Metric("tollgate.concurrency_failures"); got != 0 {
			t.Errorf("concurrency_failures %d", got)
		}
	})

	// The fleet bound is the lease logic's, the same on every host: it runs on the wazero
	// host only, sparing four Envoy start-ups per release (the suite's time budget).
	if onEnvoy(host) {
		return
	}
	t.Run("four gateways", func(t *testing.T) {
		const gateways = 4
		u := startSlowUpstream(t)
		name := uniqueKey("inflight-fleet")
		gws := startGateways(t, gateways, func(i int) harness.GatewayConfig {
			return harness.GatewayConfig{Host: host, Wasm: e.bins.Wasm, Workers: 2, NodeID: fmt.Sprintf("%s-gw%d", name, i+1),
				Rules: []byte(rules), Pin: pinned, Services: e.serviceAddrs(), Secret: syncSecret,
				Sync: harness.Sync{ExpectedNodes: gateways}, Upstream: u.URL}
		})
		key := uniqueKey("llm-fleet-user")
		const bound = maxInFlight + gateways - 1
		// Each gateway admits its share, ceil(20/4) = 5 (fewer if the service counts more
		// gateways in the fleet): at least one each, never above the bound.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		r := burst(t, ctx, gws, u, 200, key, func(n int64) bool { return n >= gateways })
		cancel()
		r.wait()
		if p := u.peak.Load(); p > bound {
			for _, g := range gws {
				t.Logf("%s: %d concurrency-limited, %d failures, %d allowed", g.Name, g.Metric("tollgate.requests_concurrency_limited"),
					g.Metric("tollgate.concurrency_failures"), g.Metric("tollgate.requests_allowed"))
			}
			t.Fatalf("the upstream held %d requests at once, bound %d", p, bound)
		}
		if r.refused < 200-bound || r.other != 0 {
			t.Fatalf("%d refused, %d other answers", r.refused, r.other)
		}
		t.Logf("fleet of %d: the upstream held at most %d at once (bound %d), %d refused", gateways, u.peak.Load(), bound, r.refused)
	})
}

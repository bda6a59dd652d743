package e2e

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
)

// arrivals is an upstream that counts the requests it receives per caller key.
type arrivals struct {
	mu sync.Mutex
	n  map[string]int
}

func (a *arrivals) count(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n[key]
}

func startArrivals(t *testing.T) (*arrivals, string) {
	t.Helper()
	a := &arrivals{n: map[string]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.n[r.Header.Get("x-api-key")]++
		a.mu.Unlock()
		_, _ = w.Write([]byte("ok\n"))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return a, "http://" + ln.Addr().String()
}

// TestShapingThroughTheGateway: the compiled filter in the gateway host, one worker, a
// rule of 10 a second with max_delay 2s, and a burst of 50 concurrent requests from real
// HTTP clients. The bucket's 10 go at once, the next 20 are held and then reach the
// upstream, the rest are refused with Retry-After — give or take the permits the refill
// adds while the burst arrives. While they are held, the same worker answers another
// caller at once: a held request holds no worker (the spacing and the other caller's
// latency are measured in BENCHMARKS.md). It runs on every host (on Envoy with
// --concurrency 1).
func TestShapingThroughTheGateway(t *testing.T) {
	forHosts(t, harness.Hosts(), testShapingThroughTheGateway)
}

func testShapingThroughTheGateway(t *testing.T, host string) {
	e := sharedEnv(t)
	up, upURL := startArrivals(t)
	key := uniqueKey("shaped")
	g, err := harness.StartGateway(harness.GatewayConfig{
		Host: host, Wasm: e.bins.Wasm, Workers: 1, NodeID: uniqueKey("shape-gw"), Upstream: upURL,
		Rules: []byte(`{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"shaped","algorithm":"gcra",
			"limit":10,"window":"1s","max_delay":"2s"}]}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	ctx := ctxFor(t, 30*time.Second)
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := e.client.Get(ctx, g.URL, "/shaped", key)
			switch {
			case a.Err != nil:
				t.Error(a.Err)
			case a.OK():
				ok.Add(1)
			case a.Status == 429 && a.Get("retry-after") != "":
				refused.Add(1)
			default:
				t.Errorf("status %d %s", a.Status, a.Body)
			}
		}()
	}
	// Wait until the held requests are held (the first 10 reached the upstream and 20
	// are paused), then ask as another caller on the same worker.
	if err := harness.Poll(10*time.Second, 5*time.Millisecond, func() (bool, error) {
		return g.Metric("tollgate.requests_delayed") >= 20 || ok.Load()+refused.Load() >= 30, nil
	}); err != nil {
		t.Fatal(err)
	}
	other := e.client.Get(ctx, g.URL, "/shaped", uniqueKey("other"))
	heldLeft := 30 - up.count(key)
	if !other.OK() {
		t.Fatalf("another caller: status %d", other.Status)
	}
	if heldLeft <= 0 {
		t.Errorf("another caller was answered only after every held request went on: the held requests blocked the worker")
	}
	wg.Wait()
	elapsed := time.Since(start)
	// The refill while the burst arrived (10 a second) may let a few more through.
	extra := int64(elapsed.Seconds()*10) + 1
	t.Logf("%d through, %d refused in %s; another caller answered with %d held requests still waiting", ok.Load(), refused.Load(), elapsed.Round(time.Millisecond), heldLeft)
	if ok.Load() < 30 || ok.Load() > 30+extra || ok.Load()+refused.Load() != 50 {
		t.Errorf("%d through, %d refused; want 30 (10 at once, 20 held) to %d through, the rest refused", ok.Load(), refused.Load(), 30+extra)
	}
	if n := up.count(key); int64(n) != ok.Load() {
		t.Errorf("the upstream saw %d of the key's requests, %d were let through", n, ok.Load())
	}
	if d := g.Metric("tollgate.requests_delayed"); d < 20 {
		t.Errorf("requests_delayed %d, want at least 20", d)
	}
}

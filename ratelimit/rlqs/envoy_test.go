package rlqs

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/tollgate-rl/tollgate/internal/envoyproc"
)

func envoyBinary(t *testing.T) (root, bin string) {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin, err = envoyproc.Binary(root, envoyproc.Newest)
	if err != nil {
		t.Fatal(err) // fails, not skips: `make envoy` installs it
	}
	return root, bin
}

// TestEnvoyValidates: the shipped deploy/envoy-rlqs.yaml is a configuration Envoy's
// newest release accepts (envoy --mode validate builds every filter and matcher).
func TestEnvoyValidates(t *testing.T) {
	root, bin := envoyBinary(t)
	out, err := exec.Command(bin, "--mode", "validate", "-c", filepath.Join(root, "deploy", "envoy-rlqs.yaml")).CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("OK")) {
		t.Fatalf("envoy --mode validate: %v\n%s", err, out)
	}
}

// envoyWith starts Envoy from deploy/envoy-rlqs.yaml with its RLQS cluster at rlqsAddr
// and returns the listener's base URL.
func envoyWith(t *testing.T, rlqsAddr string, workers int) (string, *envoyproc.Proc) {
	t.Helper()
	root, bin := envoyBinary(t)
	backend, stopBackend, err := envoyproc.Upstream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopBackend)
	listen := freePort(t)
	yaml, err := envoyproc.GRPCServiceConfig(root, "envoy-rlqs.yaml", envoyproc.Shipped{
		Listener: listen, Backend: portOf(t, backend), GRPC: portOf(t, rlqsAddr), SyncSecret: secret})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	proc, err := envoyproc.Start(ctx, envoyproc.Options{Binary: bin, Config: yaml, Dir: t.TempDir(), Concurrency: workers, LogLevel: "info",
		Args: []string{"--file-flush-interval-msec", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			// The filter's own lines: what it did with each assignment.
			if b, err := os.ReadFile(proc.LogPath); err == nil {
				for _, l := range strings.Split(string(b), "\n") {
					if strings.Contains(l, "rate_limit_quota") {
						t.Log(l)
					}
				}
			}
		}
		_ = proc.Stop()
	})
	return "http://127.0.0.1:" + strconv.Itoa(listen), proc
}

// get sends one request with x-api-key key and returns its status.
func get(t testing.TB, base, key string) int {
	req, _ := http.NewRequest(http.MethodGet, base+"/x", nil)
	req.Header.Set("X-Api-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestThroughEnvoy: Envoy's rate_limit_quota filter with this service and Redis. One
// key of limit 20 an hour (nothing refills while it runs), offered 60 requests: the first (before any assignment) is
// admitted as no_assignment_behavior says, the service's assignment (a token bucket of
// the whole rule's rate, at most what the bucket holds at once: one Envoy) refuses
// locally what is beyond it, and the next 5 s
// report charges exactly what Envoy admitted to the rule's Redis bucket.
func TestThroughEnvoy(t *testing.T) {
	e := start(t, Options{})
	e.putRules(t, `{"rules": [
  {"id": "plan", "limit": 20, "window": "1h", "match": {"prefix": "/"},
   "descriptors": {"domain": "tollgate", "entries": [{"key": "api_key"}]}}
]}`)
	base, _ := envoyWith(t, e.addr, 1)
	key := uniq("k")
	if got := get(t, base, key); got != http.StatusOK {
		t.Fatalf("first request (no assignment, ALLOW_ALL): %d", got)
	}
	waitFor(t, 5*time.Second, "the first report's answer", func() bool {
		return testutil.ToFloat64(e.srv.m.pushes.WithLabelValues("report")) >= 1
	})
	time.Sleep(200 * time.Millisecond) // Envoy applies it on its main thread
	admitted, refused := 1, 0
	for i := 0; i < 60; i++ {
		switch c := get(t, base, key); c {
		case http.StatusOK:
			admitted++
		case http.StatusTooManyRequests:
			refused++
		default:
			t.Fatalf("status %d", c)
		}
	}
	t.Logf("61 requests: %d admitted, %d refused locally", admitted, refused)
	// The first, before the assignment, and the 19 the bucket held after it was charged
	// (the assignment's max_tokens).
	if admitted != 20 {
		t.Errorf("admitted %d, want 20", admitted)
	}
	var charged int64
	end := time.Now().Add(12 * time.Second)
	for time.Now().Before(end) {
		charged = e.consumed(t, key, "plan", 20)
		if charged >= int64(admitted) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("reports ok %v failed %v, allowed reported %v", testutil.ToFloat64(e.srv.m.reports.WithLabelValues("ok")), testutil.ToFloat64(e.srv.m.reports.WithLabelValues("failed")), testutil.ToFloat64(e.srv.m.requests.WithLabelValues("allowed")))
	if charged != int64(admitted) {
		t.Errorf("charged %d to Redis, Envoy admitted %d", charged, admitted)
	}
	if d := testutil.ToFloat64(e.srv.m.requests.WithLabelValues("denied")); d < float64(refused) {
		t.Errorf("reported denied %v, refused %d", d, refused)
	}
}

// TestEnvoyNoAssignment: an Envoy whose service cannot be reached never gets an
// assignment: its buckets follow no_assignment_behavior (ALLOW_ALL in the shipped
// configuration), so nothing is refused.
func TestEnvoyNoAssignment(t *testing.T) {
	base, _ := envoyWith(t, "127.0.0.1:"+strconv.Itoa(freePort(t)), 1)
	key := uniq("k")
	for i := 0; i < 50; i++ {
		if c := get(t, base, key); c != http.StatusOK {
			t.Fatalf("request %d: %d, want 200 (no assignment: ALLOW_ALL)", i+1, c)
		}
	}
}

func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !ok() {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	port, err := envoyproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestEnvoysOneKey: four Envoys of two workers share one key of limit 20 per 10 s
// (token bucket, capacity 20), offered ten times that (20 requests a second over the
// fleet, paced, from two clients per Envoy) for fleetSeconds. The fleet admits at most the rule's own bound, capacity + rate·T, plus
// what RATIONALE.md "Envoy's rate_limit_quota filter" derives for this path: one more
// capacity (the bursts of assignments sized from reports up to 5 s old), the rule's
// rate over one report interval and a heartbeat, each Envoy's first request (before any
// assignment), and the bursts raised to one permit (all but one Envoy's). Redis is charged exactly what the Envoys admitted.
func TestEnvoysOneKey(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for 60 s")
	}
	const (
		limit        = 20
		windowS      = 10
		capacity     = 20
		fleetSeconds = 60
		reportS      = 5
		heartbeatS   = 1
		envoys       = 4
		clients      = 2                                                       // per Envoy, on their own connections
		pace         = envoys * clients * windowS * time.Second / (10 * limit) // 10× the limit over the fleet
	)
	e := start(t, Options{})
	e.putRules(t, `{"rules": [
  {"id": "plan", "limit": 20, "window": "10s", "match": {"prefix": "/"},
   "descriptors": {"domain": "tollgate", "entries": [{"key": "api_key"}]}}
]}`)
	var bases []string
	for i := 0; i < envoys; i++ {
		b, _ := envoyWith(t, e.addr, 2)
		bases = append(bases, b)
	}
	key := uniq("k")
	type count struct{ ok, refused int }
	counts := make([]count, envoys*clients)
	done := make(chan int)
	start := time.Now()
	for i := range counts {
		base := bases[i/clients]
		go func() {
			tick := time.NewTicker(pace)
			defer tick.Stop()
			for time.Since(start) < fleetSeconds*time.Second {
				switch get(t, base, key) {
				case http.StatusOK:
					counts[i].ok++
				case http.StatusTooManyRequests:
					counts[i].refused++
				}
				<-tick.C
			}
			done <- i
		}()
	}
	for range counts {
		<-done
	}
	elapsed := time.Since(start).Seconds()
	admitted := 0
	for i, c := range counts {
		t.Logf("envoy %d client %d: %d admitted, %d refused", i/clients, i%clients, c.ok, c.refused)
		admitted += c.ok
	}
	ideal := capacity + limit*elapsed/windowS
	bound := 2*capacity + limit*(elapsed+reportS+heartbeatS)/windowS + 2*envoys - 1
	t.Logf("fleet admitted %d over %.1f s: the rule's own bound %.0f, this path's %.0f", admitted, elapsed, ideal, bound)
	t.Logf("streams %v; actions sent: report %v, change %v; reports ok %v failed %v", testutil.ToFloat64(e.srv.m.streams),
		testutil.ToFloat64(e.srv.m.pushes.WithLabelValues("report")), testutil.ToFloat64(e.srv.m.pushes.WithLabelValues("change")),
		testutil.ToFloat64(e.srv.m.reports.WithLabelValues("ok")), testutil.ToFloat64(e.srv.m.reports.WithLabelValues("failed")))
	if float64(admitted) > bound {
		t.Errorf("fleet admitted %d, above the bound %.0f", admitted, bound)
	}
	if float64(admitted) < limit*elapsed/windowS*0.9 {
		t.Errorf("fleet admitted %d, under 90%% of the rule's rate over %.1f s", admitted, elapsed)
	}
	want := float64(admitted)
	waitFor(t, 2*reportS*time.Second, "the reports of every admitted request", func() bool {
		return testutil.ToFloat64(e.srv.m.requests.WithLabelValues("allowed")) >= want
	})
	if got := testutil.ToFloat64(e.srv.m.requests.WithLabelValues("allowed")); got != want {
		t.Errorf("Envoys reported %v admitted, clients saw %v", got, want)
	}
}

// TestEnvoysNinetyPercent: a client at 90 % of its limit (20 per 10 s) over four Envoys
// of two workers, its requests spread evenly (round robin) and unevenly (7 in 10 to one
// Envoy, 1 in 10 to each other), is refused at most what RATIONALE.md "Envoy's
// rate_limit_quota filter" states a client within its limit can be refused on this path:
// falseRejectBound, and for the uneven client also what the busiest Envoy refuses
// beyond its even share until the shares follow the demand, two reports and a
// heartbeat.
func TestEnvoysNinetyPercent(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for 60 s")
	}
	const (
		envoys           = 4
		seconds          = 30
		falseRejectBound = 0.05
		settleS          = 2*5 + 1 // two reports and a heartbeat
	)
	e := start(t, Options{})
	e.putRules(t, `{"rules": [
  {"id": "plan", "limit": 20, "window": "10s", "match": {"prefix": "/"},
   "descriptors": {"domain": "tollgate", "entries": [{"key": "api_key"}]}}
]}`)
	var bases []string
	for i := 0; i < envoys; i++ {
		b, _ := envoyWith(t, e.addr, 2)
		bases = append(bases, b)
	}
	for _, tt := range []struct {
		name  string
		to    []int   // the Envoy of each request, in turn
		bound float64 // of the client's requests
	}{
		{"even", []int{0, 1, 2, 3}, falseRejectBound},
		{"uneven", []int{0, 1, 0, 2, 0, 3, 0, 0, 0, 0}, falseRejectBound + (0.7-1.0/envoys)*settleS/seconds},
	} {
		t.Run(tt.name, func(t *testing.T) {
			key := uniq("k")
			// 1.8 requests a second over the fleet.
			tick := time.NewTicker(time.Second * 10 / 18)
			defer tick.Stop()
			sent, refused := 0, 0
			byEnvoy := make([]int, envoys)
			var timeline []string // each refusal: when, at which Envoy
			for start := time.Now(); time.Since(start) < seconds*time.Second; <-tick.C {
				to := tt.to[sent%len(tt.to)]
				if get(t, bases[to], key) == http.StatusTooManyRequests {
					refused++
					byEnvoy[to]++
					timeline = append(timeline, fmt.Sprintf("%.1fs:%d", time.Since(start).Seconds(), to))
				}
				sent++
			}
			rate := float64(refused) / float64(sent)
			t.Logf("client at 90%%, %s: %d sent, %d refused (%.2f%%), by Envoy %v, at %v", tt.name, sent, refused, 100*rate, byEnvoy, timeline)
			if rate > tt.bound {
				t.Errorf("refused %.2f%% of a client within its limit, bound %.1f%%", 100*rate, 100*tt.bound)
			}
		})
	}
}

// TestEnvoyServiceRestart: the service stops while an Envoy enforces a deny on a spent
// key, and a new one starts on the same address. The stop's TTL-0 assignment makes the
// Envoy fall back at once to expired_assignment_behavior (ALLOW_ALL in the shipped
// file): no request fails, and the spent key is admitted while no service answers. The
// Envoy reopens its stream at its next report and the new service, on the same Redis,
// denies the key again.
func TestEnvoyServiceRestart(t *testing.T) {
	rules := `{"rules": [
  {"id": "plan", "limit": 5, "window": "1h", "match": {"prefix": "/"},
   "descriptors": {"domain": "tollgate", "entries": [{"key": "api_key"}]}}
]}`
	e := start(t, Options{})
	e.putRules(t, rules)
	base, _ := envoyWith(t, e.addr, 1)
	key := uniq("k")
	statuses := func(n int) (ok, refused int) {
		for i := 0; i < n; i++ {
			switch c := get(t, base, key); c {
			case http.StatusOK:
				ok++
			case http.StatusTooManyRequests:
				refused++
			default:
				t.Fatalf("status %d: a request failed", c)
			}
		}
		return ok, refused
	}
	statuses(1)
	waitFor(t, 5*time.Second, "the first assignment", func() bool {
		return testutil.ToFloat64(e.srv.m.pushes.WithLabelValues("report")) >= 1
	})
	time.Sleep(200 * time.Millisecond)
	if ok, _ := statuses(10); ok != 4 {
		t.Fatalf("admitted %d after the first, want 4 (limit 5)", ok)
	}

	e.stop()
	time.Sleep(200 * time.Millisecond)
	if ok, _ := statuses(10); ok != 10 {
		t.Fatalf("service stopped: admitted %d of 10, want all (TTL 0, expired_assignment_behavior ALLOW_ALL)", ok)
	}

	e2 := startAt(t, Options{}, e.addr)
	e2.putRules(t, rules)
	restarted := time.Now()
	waitFor(t, 15*time.Second, "a refusal from the new service's assignment", func() bool {
		_, refused := statuses(1)
		return refused > 0
	})
	t.Logf("refusals resumed %.1f s after the restart", time.Since(restarted).Seconds())
}

// TestEnvoyRuleChange: a rule raised while an Envoy refuses a key reaches the Envoy by
// push, within a heartbeat, not at its next report. Envoy 1.40 starts a changed token
// bucket as full as the one it replaces (a drained one empty): the raised limit admits
// at its new rate (10 a second here) from the push on.
func TestEnvoyRuleChange(t *testing.T) {
	const rules = `{"rules": [
  {"id": "plan", "limit": %d, "window": "1h", "match": {"prefix": "/"},
   "descriptors": {"domain": "tollgate", "entries": [{"key": "api_key"}]}}
]}`
	e := start(t, Options{})
	e.putRules(t, fmt.Sprintf(rules, 5))
	base, _ := envoyWith(t, e.addr, 1)
	key := uniq("k")
	get(t, base, key)
	waitFor(t, 5*time.Second, "the first assignment", func() bool {
		return testutil.ToFloat64(e.srv.m.pushes.WithLabelValues("report")) >= 1
	})
	time.Sleep(200 * time.Millisecond)
	for i := 0; i < 10; i++ {
		get(t, base, key)
	}
	if c := get(t, base, key); c != http.StatusTooManyRequests {
		t.Fatalf("key over its limit of 5: %d", c)
	}
	reports := testutil.ToFloat64(e.srv.m.reports.WithLabelValues("ok"))
	e.putRules(t, fmt.Sprintf(rules, 36000))
	changed := time.Now()
	waitFor(t, 3*time.Second, "an admission under the raised limit", func() bool {
		return get(t, base, key) == http.StatusOK
	})
	t.Logf("raised limit admitted %.2f s after the change", time.Since(changed).Seconds())
	if r := testutil.ToFloat64(e.srv.m.reports.WithLabelValues("ok")); r != reports {
		t.Logf("(a report arrived meanwhile: %v → %v)", reports, r)
	}
	if testutil.ToFloat64(e.srv.m.pushes.WithLabelValues("change")) < 1 {
		t.Errorf("no assignment pushed for the rule change")
	}
}

// TestEnvoyAndRLSOneKey: an Envoy on RLQS and a client of the gRPC RLS path (strict
// checks) share one key of limit 20 per 10 s, each offered ten times that for 20 s. The
// RLS path's admissions show in what the global bucket holds, which caps the Envoy's
// bursts and denies it: the total stays within the bound of TestEnvoysOneKey with n = 1.
func TestEnvoyAndRLSOneKey(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for 20 s")
	}
	const (
		limit, windowS, capacity = 20, 10, 20
		seconds, reportS, hbS    = 20, 5, 1
	)
	e := start(t, Options{})
	e.putRules(t, `{"rules": [
  {"id": "plan", "limit": 20, "window": "10s", "match": {"prefix": "/"},
   "descriptors": {"domain": "tollgate", "entries": [{"key": "api_key"}]}}
]}`)
	base, _ := envoyWith(t, e.addr, 1)
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rlsClient := rlsv3.NewRateLimitServiceClient(conn)
	key := uniq("k")
	req := &rlsv3.RateLimitRequest{Domain: "tollgate", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: key}}}}}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+secret)
	var viaEnvoy, viaRLS int
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for time.Since(start) < seconds*time.Second {
			if get(t, base, key) == http.StatusOK {
				viaEnvoy++
			}
			<-tick.C
		}
	}()
	tick := time.NewTicker(100 * time.Millisecond)
	for time.Since(start) < seconds*time.Second {
		resp, err := rlsClient.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode == rlsv3.RateLimitResponse_OK {
			viaRLS++
		}
		<-tick.C
	}
	tick.Stop()
	<-done
	elapsed := time.Since(start).Seconds()
	total := viaEnvoy + viaRLS
	ideal := capacity + limit*elapsed/windowS
	bound := 2*capacity + limit*(elapsed+reportS+hbS)/windowS + 1
	t.Logf("admitted %d (Envoy %d, RLS %d) over %.1f s: the rule's own bound %.0f, this path's %.0f", total, viaEnvoy, viaRLS, elapsed, ideal, bound)
	if float64(total) > bound {
		t.Errorf("admitted %d, above the bound %.0f", total, bound)
	}
}

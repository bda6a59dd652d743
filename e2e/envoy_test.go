package e2e

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
)

// TestAccessLogAndRuleStats: what an operator of the shipped envoy.yaml reads. Envoy's
// access log line for each request carries the filter's decision from
// %FILTER_STATE(wasm.tollgate:PLAIN)% — rule, decision, remaining, limit, degraded and
// the caller key's hash, never the key — and /stats/prometheus shows the per-rule
// counters as one series per rule, the rule cut out of the stat name into a "rule" tag by
// the bootstrap's stats_tags. Envoy hosts only: both are Envoy's (on the wazero host the
// same decision reaches the tollgate-gateway's access log and /metrics, scenario 14).
func TestAccessLogAndRuleStats(t *testing.T) {
	forHostsAtOnce(t, harness.EnvoyHosts(), testAccessLogAndRuleStats)
}

func testAccessLogAndRuleStats(t *testing.T, host string) {
	e := sharedEnv(t)
	rule := strings.ReplaceAll(uniqueKey("obs"), "-", "_")
	g, err := harness.StartGateway(harness.GatewayConfig{
		Host: host, Wasm: e.bins.Wasm, Workers: 2, NodeID: uniqueKey("obs-gw"),
		Rules: []byte(fmt.Sprintf(`{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":%q,"match":{"prefix":"/obs"},"limit":5,"window":"1m"}]}`, rule)),
		Pin:   pinned, Services: e.serviceAddrs(), Secret: syncSecret, Upstream: e.upstream.URL,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	key := uniqueKey("sk_obs_secret")
	ctx := ctxFor(t, time.Minute)
	var got []int
	for range 8 {
		got = append(got, e.client.Get(ctx, g.URL, "/obs", key).Status)
	}
	if fmt.Sprint(got) != "[200 200 200 200 200 429 429 429]" {
		t.Fatalf("statuses %v, want 5 × 200 then 3 × 429", got)
	}

	// Envoy flushes its access log every second.
	line := regexp.MustCompile(`"GET /obs HTTP/1.1" (\d+) (\S+) .* tollgate="rule=` + regexp.QuoteMeta(rule) +
		` decision=(\w+) remaining=(\d+) limit=5 degraded=false key=([0-9a-f]{16})"`)
	var lines [][]string
	err = harness.Poll(10*time.Second, 50*time.Millisecond, func() (bool, error) {
		lines = line.FindAllStringSubmatch(g.AccessLog(), -1)
		return len(lines) >= 8, nil
	})
	if err != nil {
		t.Fatalf("%d of 8 access-log lines carry the decision: %v\n%s", len(lines), err, g.AccessLog())
	}
	var decisions []string
	for _, l := range lines {
		decisions = append(decisions, l[1]+" "+l[2]+" "+l[3]+" remaining="+l[4])
		if l[5] != lines[0][5] {
			t.Errorf("key hashes differ between lines: %s and %s", l[5], lines[0][5])
		}
	}
	logTable(t, "access log on "+host, strings.Join(decisions, "\n"))
	want := "200 via_upstream allowed remaining=4|200 via_upstream allowed remaining=0|429 tollgate_rate_limited limited remaining=0"
	if seq := strings.Join([]string{decisions[0], decisions[4], decisions[5]}, "|"); seq != want {
		t.Errorf("access log decisions %q, want %q", seq, want)
	}
	if strings.Contains(g.AccessLog(), key) {
		t.Error("the access log contains the raw caller key")
	}

	prom, err := g.Envoy().Get(ctx, "/stats/prometheus")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		fmt.Sprintf(`tollgate_rule_allowed{rule=%q} 5`, rule),
		fmt.Sprintf(`tollgate_rule_limited{rule=%q} 3`, rule),
		"# TYPE tollgate_rule_allowed counter",
	} {
		if !strings.Contains(prom, want) {
			var seen []string
			for _, l := range strings.Split(prom, "\n") {
				if strings.Contains(l, "tollgate_rule_") {
					seen = append(seen, l)
				}
			}
			t.Errorf("/stats/prometheus has no %q; its rule series:\n%s", want, strings.Join(seen, "\n"))
		}
	}
}

// TestPluginReconfigured: the plugin configuration changes while the gateway runs — on
// Envoy a new listener version delivered by LDS from a watched file (the file renamed
// over), the way a control plane's update arrives, without restarting Envoy; on the
// wazero host its own reconfiguration. A rule is added and the existing one kept. The
// gateway keeps answering throughout (light traffic on another key: every answer a
// 200 or 429 with the headers), a key spent before the change stays refused after it (its
// bucket lives in shared data, which the new configuration's filters find), and the new
// rule is enforced on new connections.
func TestPluginReconfigured(t *testing.T) {
	forHostsAtOnce(t, harness.Hosts(), testPluginReconfigured)
}

func testPluginReconfigured(t *testing.T, host string) {
	e := sharedEnv(t)
	const (
		v1 = `{"key":{"source":"header","name":"x-api-key"},"rules":[
			{"id":"a","match":{"prefix":"/a"},"limit":5,"window":"1h"}]}`
		v2 = `{"key":{"source":"header","name":"x-api-key"},"rules":[
			{"id":"a","match":{"prefix":"/a"},"limit":5,"window":"1h"},
			{"id":"b","match":{"prefix":"/b"},"limit":1,"window":"1h"}]}`
	)
	cfg := harness.GatewayConfig{Host: host, Wasm: e.bins.Wasm, Workers: 2, NodeID: uniqueKey("reconf"),
		Rules: []byte(v1), Upstream: e.upstream.URL, Reloadable: true}
	g, err := harness.StartGateway(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	ctx := ctxFor(t, 2*time.Minute)
	spent := uniqueKey("spent")
	var before []int
	for range 7 {
		before = append(before, e.client.Get(ctx, g.URL, "/a", spent).Status)
	}
	if fmt.Sprint(before) != "[200 200 200 200 200 429 429]" {
		t.Fatalf("before the change: %v, want 5 × 200 then 429", before)
	}

	// Light traffic through the change on its own connections.
	stop := make(chan struct{})
	var during []harness.Answer
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c := harness.NewClient()
		defer c.Close()
		during = c.Run(ctx, harness.Load{Gateways: []*harness.Gateway{g}, Path: "/a", Key: uniqueKey("through"),
			Rate: 50, Duration: time.Hour, Workers: 4, Stop: stop})
	}()
	time.Sleep(300 * time.Millisecond) // traffic before the change
	cfg.Rules = []byte(v2)
	changeAt := time.Now()
	if err := g.Reconfigure(cfg); err != nil {
		close(stop)
		wg.Wait()
		t.Fatal(err)
	}
	took := time.Since(changeAt)
	time.Sleep(300 * time.Millisecond) // and after it
	close(stop)
	wg.Wait()

	fresh := harness.NewClient() // new connections: the new listener version's filter chain
	defer fresh.Close()
	spentAfter := fresh.Get(ctx, g.URL, "/a", spent)
	newKey := uniqueKey("b")
	var onB []int
	for range 3 {
		onB = append(onB, fresh.Get(ctx, g.URL, "/b", newKey).Status)
	}
	tally := harness.Count(during, 1)
	logTable(t, "plugin reconfigured on "+host, harness.KV(
		"change delivered and in effect after", took.Round(time.Millisecond).String(),
		"traffic through the change", statusHistogram(during),
		"spent key on /a after the change", fmt.Sprint(spentAfter.Status),
		"new rule b (1/h), fresh key, 3 requests", fmt.Sprint(onB),
	))
	if tally.Failed+tally.Unavailable+tally.OtherStatus > 0 || missingHeaders(during) > 0 || tally.OK == 0 {
		t.Errorf("traffic through the change: %s, %d without headers", statusHistogram(during), missingHeaders(during))
	}
	if spentAfter.Status != http.StatusTooManyRequests {
		t.Errorf("the key spent before the change got %d after it: its bucket did not survive", spentAfter.Status)
	}
	if fmt.Sprint(onB) != "[200 429 429]" {
		t.Errorf("the added rule (1/h): %v, want [200 429 429]", onB)
	}
}

// panicWasm is the filter built with the tollgate_panicprobe tag (filter/panicprobe.go):
// its runtime dies with a fatal error on a request carrying x-tollgate-test-panic (a
// plain panic would be recovered by the binding). Built once per test binary.
var panicWasm = sync.OnceValues(func() ([]byte, error) { return wasmbuild.Build("./filter", "tollgate_panicprobe") })

// TestVMFailure: a worker's VM fails — the test-only module's runtime dies on a marked
// request —
// and the host answers as the plugin's failure_policy says, on every host. FAIL_OPEN (as
// shipped): the requests the failed VM would have seen pass unfiltered — no rate-limit
// headers, a spent key admitted — while the other worker's VM keeps enforcing. FAIL_CLOSED:
// they get 503. Under both, the request during which the VM died gets 503. Connections
// are pinned to workers, so each worker's answer is known.
func TestVMFailure(t *testing.T) {
	forHostsAtOnce(t, harness.Hosts(), testVMFailure)
}

func testVMFailure(t *testing.T, host string) {
	e := sharedEnv(t)
	wasm, err := panicWasm()
	if err != nil {
		t.Fatal(err)
	}
	for _, policy := range []string{"FAIL_OPEN", "FAIL_CLOSED"} {
		t.Run(policy, func(t *testing.T) {
			g, err := harness.StartGateway(harness.GatewayConfig{Host: host, Wasm: wasm, Workers: 2, NodeID: uniqueKey("vmfail"),
				Rules:    []byte(`{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"v","match":{"prefix":"/v"},"limit":2,"window":"1h"}]}`),
				Upstream: e.upstream.URL, FailurePolicy: policy})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(g.Close)
			ctx := ctxFor(t, time.Minute)
			failed, healthy := g.WorkerClient(0), g.WorkerClient(1)
			defer failed.Close()
			defer healthy.Close()
			key := uniqueKey("vm")
			var spend []int
			for range 3 {
				spend = append(spend, healthy.Get(ctx, g.URL, "/v", key).Status)
			}
			if fmt.Sprint(spend) != "[200 200 429]" {
				t.Fatalf("before the failure: %v, want [200 200 429]", spend)
			}
			marked := failed.Get(ctx, g.URL, "/v", uniqueKey("marker"), [2]string{"x-tollgate-test-panic", "1"})
			var after, other []harness.Answer
			for range 3 {
				after = append(after, failed.Get(ctx, g.URL, "/v", key))
				other = append(other, healthy.Get(ctx, g.URL, "/v", key))
			}
			logTable(t, fmt.Sprintf("VM failure on %s, %s", host, policy), harness.KV(
				"marked request (the VM dies)", fmt.Sprintf("%d %v %q", marked.Status, marked.Err, marked.Body),
				"spent key on the failed worker", statusHistogram(after)+fmt.Sprintf(", rate-limit headers: %v", after[0].Get("X-RateLimit-Limit") != ""),
				"spent key on the other worker", statusHistogram(other),
			))
			for i := range after {
				a := &after[i]
				switch policy {
				case "FAIL_OPEN":
					if a.Status != http.StatusOK || a.Get("X-RateLimit-Limit") != "" {
						t.Errorf("failed worker, fail open: status %d, x-ratelimit-limit %q; want 200 unfiltered", a.Status, a.Get("X-RateLimit-Limit"))
					}
				case "FAIL_CLOSED":
					if a.Status != http.StatusServiceUnavailable {
						t.Errorf("failed worker, fail closed: status %d %v, want 503", a.Status, a.Err)
					}
				}
				if o := other[i]; o.Status != http.StatusTooManyRequests || !o.LimitHeaders() {
					t.Errorf("the other worker: status %d, want 429 with the headers (its VM still enforces)", o.Status)
				}
			}
			// The request during which the VM died gets 503 under either policy (Envoy
			// 1.36.2 and 1.40.0 alike; the wazero host follows them).
			if marked.Status != http.StatusServiceUnavailable {
				t.Errorf("the marked request: %d %v, want 503", marked.Status, marked.Err)
			}
		})
	}
}

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tollgate-rl/tollgate/deploy"
	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
	"github.com/tollgate-rl/tollgate/internal/hostdelay"
	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
)

const (
	adminToken = "e2e-admin-token"
	syncSecret = "e2e-sync-secret"
	// pinned is the rule-set version written into the plugin configuration of every
	// gateway that must keep its own rules: the rules scenario stores rule sets at the
	// service, and a gateway adopts one only when it is newer than its own.
	pinned = 1 << 40
)

// env is what every scenario shares: a six-node Redis Cluster, two service replicas in
// front of it, and the upstream. Scenarios bring their own gateways and caller keys.
type env struct {
	bins     *harness.Binaries
	redis    *redistest.Cluster
	svc      []*harness.Service
	upstream *harness.Upstream
	client   *harness.Client

	fleetsMu sync.Mutex
	fleets   map[string][]*harness.Gateway // shipped-configuration fleets on Envoy, by host
}

var (
	envOnce sync.Once
	shared  *env
	envErr  error
)

// parallelScenarios is how many scenarios marked parallel run at once unless
// -test.parallel says otherwise (its default is GOMAXPROCS, 2 on the build machine):
// most scenarios spend their time waiting — for syncs, TTLs, windows, an Envoy's start —
// not computing.
const parallelScenarios = 4

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", strconv.Itoa(parallelScenarios)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	code := m.Run()
	if shared != nil {
		shared.stop()
	}
	os.Exit(code)
}

// sharedEnv starts the environment on first use (so `go test -run X` starts only what X
// needs) and fails the test when it cannot.
func sharedEnv(t *testing.T) *env {
	t.Helper()
	envOnce.Do(func() {
		start := time.Now()
		shared, envErr = startEnv()
		if envErr == nil {
			t.Logf("environment up in %v: Redis Cluster %v, services %s and %s",
				time.Since(start).Round(time.Millisecond), shared.redis.Addrs(), shared.svc[0].Addr(), shared.svc[1].Addr())
		}
	})
	if envErr != nil {
		t.Fatalf("e2e environment: %v", envErr)
	}
	return shared
}

func startEnv() (*env, error) {
	e := &env{client: harness.NewClient()}
	var err error
	if e.bins, err = harness.Build(); err != nil {
		return nil, err
	}
	if e.redis, err = redistest.LaunchCluster(redistest.Options{}); err != nil {
		e.stop()
		return nil, err
	}
	for i := 0; i < 2; i++ {
		s, err := harness.StartService(e.serviceConfig(sharedServiceArgs...))
		if err != nil {
			e.stop()
			return nil, err
		}
		e.svc = append(e.svc, s)
	}
	if e.upstream, err = harness.StartUpstream(); err != nil {
		e.stop()
		return nil, err
	}
	return e, nil
}

// sharedServiceArgs configure the two shared replicas. Progressive penalties are made
// negligible (1 ms cooldowns): the fleet scenarios drive a key at 10x its limit while
// ignoring Retry-After, which penalties exist to stop, and they measure the lease
// protocol's bounds, which a locked-out key would make trivially true. The policy
// scenario runs its own service with real penalties.
var sharedServiceArgs = []string{"--penalty-base", "1ms", "--penalty-max", "1ms"}

func (e *env) serviceConfig(args ...string) harness.ServiceConfig {
	return harness.ServiceConfig{
		Bin: e.bins.Service, RedisMode: "cluster", RedisAddrs: e.redis.Addrs(),
		AdminToken: adminToken, SyncSecret: syncSecret, Args: args,
	}
}

func (e *env) stop() {
	for _, gws := range e.fleets {
		for _, g := range gws {
			g.Close()
		}
	}
	for _, s := range e.svc {
		s.Stop()
	}
	if e.upstream != nil {
		e.upstream.Close()
	}
	if e.redis != nil {
		e.redis.Stop()
	}
	e.client.Close()
	e.bins.Remove()
}

func (e *env) admin() harness.Admin { return harness.Admin{Base: e.svc[0].URL(), Token: adminToken} }

func (e *env) serviceAddrs() []string {
	out := make([]string, len(e.svc))
	for i, s := range e.svc {
		out[i] = s.Addr()
	}
	return out
}

// fleet starts n gateways named <name>-gw<i> on the wazero host running rules, pinned to
// them unless pin is false, syncing with the shared services; they are closed at the end
// of the test.
func (e *env) fleet(t *testing.T, name string, n int, rules string, pin bool, s harness.Sync) []*harness.Gateway {
	t.Helper()
	return e.fleetOn(t, harness.Wazero, e.serviceAddrs(), name, n, rules, pin, s)
}

// fleetOn is fleet on the given host, syncing with the given service endpoints.
func (e *env) fleetOn(t *testing.T, host string, services []string, name string, n int, rules string, pin bool, s harness.Sync) []*harness.Gateway {
	t.Helper()
	var v uint64
	if pin {
		v = pinned
	}
	if s.ExpectedNodes == 0 {
		s.ExpectedNodes = n
	}
	return startGateways(t, n, func(i int) harness.GatewayConfig {
		return harness.GatewayConfig{
			Host: host, Wasm: e.bins.Wasm, Workers: 2, NodeID: fmt.Sprintf("%s-gw%d", name, i+1),
			Rules: []byte(rules), Pin: v, Services: services, Secret: syncSecret,
			Sync: s, Upstream: e.upstream.URL,
		}
	})
}

// startGateways starts n gateways at once (an Envoy process takes ~2 s to start) and
// closes them at the end of the test.
func startGateways(t *testing.T, n int, cfg func(i int) harness.GatewayConfig) []*harness.Gateway {
	t.Helper()
	gws := make([]*harness.Gateway, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range gws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gws[i], errs[i] = harness.StartGateway(cfg(i))
		}()
	}
	wg.Wait()
	for i, g := range gws {
		if g != nil {
			t.Cleanup(g.Close)
		}
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
	}
	return gws
}

// forHosts runs a scenario once on each host, as a subtest named after it (TestX/wazero,
// TestX/envoy-1.40.0): a scenario is written once and runs wherever it applies. The
// hosts take turns: the scenarios that load the machine, or share one fleet per host.
func forHosts(t *testing.T, hosts []string, scenario func(t *testing.T, host string)) {
	for _, h := range hosts {
		t.Run(h, func(t *testing.T) { scenario(t, h) })
	}
}

// forHostsAtOnce is forHosts for a scenario whose runs share nothing (each starts its
// own gateways, and service when it needs one) and mostly wait: its hosts run in
// parallel with each other and with the other parallel scenarios.
func forHostsAtOnce(t *testing.T, hosts []string, scenario func(t *testing.T, host string)) {
	t.Parallel()
	for _, h := range hosts {
		t.Run(h, func(t *testing.T) {
			t.Parallel()
			scenario(t, h)
		})
	}
}

// hostDelay starts a probe of the machine's own delays (hostdelay.Probe) for the rest of
// the test: a wall-clock bound is asserted net of what the host added meanwhile. Besides
// its own loopback round trip it asks each shared service replica's /healthz (answered
// without Redis), so a stall of the service processes counts too — except the replicas
// named in skip (a scenario's victim: its restart is not the host's delay).
func hostDelay(t *testing.T, skip ...*harness.Service) *hostdelay.Probe {
	t.Helper()
	var also []string
	if shared != nil {
		for _, s := range shared.svc {
			if !slices.Contains(skip, s) {
				also = append(also, s.URL()+"/healthz")
			}
		}
	}
	hd, err := hostdelay.Start(5*time.Millisecond, also...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hd.Close)
	return hd
}

// within reports whether something that took from start to end met the product's bound,
// given the longest delay the host imposed on a no-op meanwhile (allowed on top of the
// bound: the host's scheduling, not the product's), and says so for a message.
func within(hd *hostdelay.Probe, start, end time.Time, bound time.Duration) (bool, string) {
	host := hd.Max(start, end)
	took := end.Sub(start)
	return took <= bound+host, fmt.Sprintf("%v (bound %v + the host's longest delay meanwhile %v)",
		took.Round(time.Millisecond), bound, host.Round(time.Millisecond))
}

// pollWithin polls cond (as harness.Poll) for up to 10 s and reports whether it held
// within the product's bound plus the host's longest delay meanwhile (see within): a
// failure says how long it took, rather than only that it was late.
func pollWithin(hd *hostdelay.Probe, bound, interval time.Duration, cond func() (bool, error)) error {
	start := time.Now()
	if err := harness.Poll(bound+10*time.Second, interval, cond); err != nil {
		return err
	}
	if ok, msg := within(hd, start, time.Now(), bound); !ok {
		return fmt.Errorf("took %s", msg)
	}
	return nil
}

// degradedWindow is how long before a gateway starts answering degraded the host's
// delays are looked at: the product's degraded bound (RATIONALE.md §3: a sync unanswered
// for 125 ms once nothing succeeded for two 100 ms intervals). hostStall is the delay of
// a no-op timer and loopback round trip (hostdelay.Probe) that counts as the machine
// stalling: half those 125 ms. On a quiet machine the probe's longest delay over such a
// window is a few milliseconds; at load average 17 on 2 cores it reached 170 ms.
const (
	degradedWindow = 250 * time.Millisecond
	hostStall      = 60 * time.Millisecond
)

// degradedEpisodes groups the degraded answers of each gateway into episodes (answers
// less than degradedWindow apart) and splits them: an episode is explained when the host
// stalled (hostStall or more) in the degradedWindow before its first answer — the
// product's bound doing its job on a machine that kept the gateway, the service or Redis
// waiting — and unexplained otherwise. It returns the unexplained answers' count and a
// line for the log.
func degradedEpisodes(hd *hostdelay.Probe, answers ...[]harness.Answer) (unexplained int, summary string) {
	byGW := map[int][]time.Time{}
	for _, as := range answers {
		for i := range as {
			if as[i].Degraded() {
				byGW[as[i].Gateway] = append(byGW[as[i].Gateway], arrival(&as[i]))
			}
		}
	}
	var explained, other, explainedAnswers int
	var longest time.Duration
	var unexplainedDelays []time.Duration
	for _, ts := range byGW {
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
		for i := 0; i < len(ts); {
			j := i + 1
			for j < len(ts) && ts[j].Sub(ts[j-1]) < degradedWindow {
				j++
			}
			d := hd.Max(ts[i].Add(-degradedWindow), ts[i])
			if d >= hostStall {
				explained++
				explainedAnswers += j - i
				longest = max(longest, d)
			} else {
				other++
				unexplained += j - i
				unexplainedDelays = append(unexplainedDelays, d.Round(time.Millisecond))
			}
			i = j
		}
	}
	return unexplained, fmt.Sprintf("%d episodes (%d answers) after a host stall of %v or more in the %v before (longest %v); %d episodes (%d answers) without one (the host's longest delays before them: %v)",
		explained, explainedAnswers, hostStall, degradedWindow, longest.Round(time.Millisecond), other, unexplained, unexplainedDelays)
}

// fullLength reports whether TOLLGATE_E2E_FULL=1 asks the scenarios on Envoy to run as
// long as on the wazero host; by default (make test) they run shorter, to keep the suite
// within its time budget.
func fullLength() bool { return os.Getenv("TOLLGATE_E2E_FULL") == "1" }

// onEnvoy reports whether host is a real Envoy.
func onEnvoy(host string) bool { return host != harness.Wazero }

// nodesLastSeen reads the service's fleet record (store.NodesKey: node id → unix ms of
// its last sync, written by each service instance at most once a second) from Redis.
func (e *env) nodesLastSeen(ctx context.Context) (map[string]time.Time, error) {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: e.redis.Addrs()})
	defer rdb.Close()
	zs, err := rdb.ZRangeWithScores(ctx, store.NodesKey, 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("ZRANGE %s: %w", store.NodesKey, err)
	}
	out := make(map[string]time.Time, len(zs))
	for _, z := range zs {
		if m, ok := z.Member.(string); ok {
			out[m] = time.UnixMilli(int64(z.Score))
		}
	}
	return out, nil
}

// uniqueKey is a caller key no earlier run used (Redis state outlives a test in -count=N).
func uniqueKey(prefix string) string {
	return prefix + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
}

// sumMetric adds a filter metric over gateways.
func sumMetric(gws []*harness.Gateway, name string) int64 {
	var n int64
	for _, g := range gws {
		n += g.Metric(name)
	}
	return n
}

// tokenBucketConsumed is what Redis has charged a token bucket since its first charge at
// t0 (client clock; Redis runs on the same machine): permits out of the bucket now plus
// the refill since t0, minus leases still outstanding (reserved, not consumed). It holds
// while the bucket never filled up again after t0 — the scenarios keep it under load.
func tokenBucketConsumed(b *store.BucketUsage, nowUs int64, t0 time.Time) float64 {
	elapsedUs := float64(nowUs - t0.UnixMicro())
	refill := float64(b.Limit) * elapsedUs / float64(b.WindowMs*1000)
	capacity := b.Burst
	if capacity == 0 {
		capacity = b.Limit
	}
	return float64(capacity-b.Remaining) + refill - float64(b.Outstanding)
}

// statusHistogram renders status codes and their counts, e.g. "200×101 429×399".
func statusHistogram(answers []harness.Answer) string {
	counts := map[int]int{}
	for i := range answers {
		counts[answers[i].Status]++
	}
	var parts []string
	for _, code := range []int{200, 403, 429, 503, 504, 0} {
		if n := counts[code]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d×%d", code, n))
			delete(counts, code)
		}
	}
	for code, n := range counts {
		parts = append(parts, fmt.Sprintf("%d×%d", code, n))
	}
	return strings.Join(parts, " ")
}

// logTable prints a scenario's measurements.
func logTable(t *testing.T, title, table string) {
	t.Helper()
	t.Logf("%s\n%s", title, table)
}

// ctxFor is a context bounded by d, cancelled at the end of the test.
func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// shippedPlugin is the plugin configuration of the shipped envoy.yaml, as
// deploy.CheckEnvoy extracts it, with the two changes this environment needs: the e2e
// services' sync secret (the shipped file has none; a deployment adds its own), and the
// version pinned (the rules scenario stores rule sets at the service, which a gateway
// would adopt as newer). Everything else — the rules, interval, timeout, breaker,
// expected_nodes 1, and no sync.node — is as shipped. node is the bootstrap's node.id
// (the shipped bootstrap sets none, so each Envoy's filter finds its own id).
func shippedPlugin(t *testing.T) (plugin []byte, node string) {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ev, err := deploy.CheckEnvoy(data)
	if err != nil {
		t.Fatalf("shipped envoy.yaml: %v", err)
	}
	var doc map[string]any
	dec := json.NewDecoder(bytes.NewReader(ev.RulesJSON))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("shipped envoy.yaml plugin configuration: %v", err)
	}
	s, ok := doc["sync"].(map[string]any)
	if !ok {
		t.Fatal("shipped envoy.yaml: the plugin configuration has no sync section")
	}
	if n, ok := s["node"]; ok {
		t.Fatalf("shipped envoy.yaml sets sync.node %v: the node id should come from Envoy", n)
	}
	s["secret"] = syncSecret
	doc["version"] = uint64(pinned)
	if plugin, err = json.Marshal(doc); err != nil {
		t.Fatal(err)
	}
	return plugin, ev.Bootstrap.GetNode().GetId()
}

// shippedFleet starts n gateways (2 workers each) on host running the shipped
// envoy.yaml's plugin configuration (shippedPlugin) against the shared services, closed
// at the end of the test. They are named <name>-gw<i> in tables only: the filter picks
// its node id.
//
// On Envoy the fleet is started once per test binary and shared by the scenarios that
// run the shipped configuration unchanged (scenarios 2 and 7 use keys of their own): an
// Envoy takes seconds to start (V8 compiles the module), and the suite has a time budget.
func (e *env) shippedFleet(t *testing.T, host, name string, n int) []*harness.Gateway {
	t.Helper()
	plugin, node := shippedPlugin(t)
	cfg := func(i int) harness.GatewayConfig {
		return harness.GatewayConfig{
			Host: host, Wasm: e.bins.Wasm, Workers: 2, Name: fmt.Sprintf("%s-gw%d", name, i+1), NodeID: node,
			Plugin: plugin, Services: e.serviceAddrs(), Upstream: e.upstream.URL,
		}
	}
	if !onEnvoy(host) {
		return startGateways(t, n, cfg)
	}
	e.fleetsMu.Lock()
	defer e.fleetsMu.Unlock()
	if gws := e.fleets[host]; len(gws) == n {
		return gws
	}
	gws := make([]*harness.Gateway, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range gws {
		wg.Add(1)
		go func() { defer wg.Done(); gws[i], errs[i] = harness.StartGateway(cfg(i)) }()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			for _, g := range gws {
				if g != nil {
					g.Close()
				}
			}
			t.Fatalf("gateway %d: %v", i+1, err)
		}
	}
	if e.fleets == nil {
		e.fleets = map[string][]*harness.Gateway{}
	}
	for _, g := range e.fleets[host] {
		g.Close()
	}
	e.fleets[host] = gws
	return gws
}

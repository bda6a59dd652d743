package e2e

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
	"github.com/tollgate-rl/tollgate/internal/envoyproc"
	"github.com/tollgate-rl/tollgate/internal/redistest"
)

const (
	tierRules100 = `{"rules":[{"id":"tier","match":{"prefix":"/api"},"limit":100,"window":"1m"}]}`
	tierRules500 = `{"rules":[{"id":"tier","match":{"prefix":"/api"},"limit":500,"window":"1m"}]}`
)

// TestRuleChangePropagates is scenario 5: an operator raises a limit from 100 to 500 per
// minute with PUT /v1/rules. Every gateway learns the new version from its next sync
// reply, fetches the rule set and enforces it; the time from the PUT to the first answer
// of each gateway that advertises the new limit is measured while each gateway carries
// light traffic: it must be at most 300 ms on every gateway. Then every
// gateway admits more than the old limit could for a fresh key. It runs on the wazero
// host and the newest Envoy: what it checks is the filter's logic (adopting a newer rule
// set from a sync reply), and the callouts it rides on are the ones every other sync
// scenario exercises on both Envoy releases; its four gateways per release were the
// suite's last Envoy starts (~4 CPU-s each).
func TestRuleChangePropagates(t *testing.T) {
	forHostsAtOnce(t, []string{harness.Wazero, harness.EnvoyHost(envoyproc.Newest)}, testRuleChangePropagates)
}

func testRuleChangePropagates(t *testing.T, host string) {
	e := sharedEnv(t)
	const requirement = 300 * time.Millisecond
	// Once the service holds a rule set it applies it to every gateway's deltas and
	// refuses rules it does not know, so the rule sets stored here must not reach the
	// services the other scenarios share: this one runs its own service on its own Redis.
	rdb, err := redistest.Launch(redistest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rdb.Stop)
	svc, err := harness.StartService(harness.ServiceConfig{Bin: e.bins.Service, RedisAddrs: rdb.Addrs(),
		AdminToken: adminToken, SyncSecret: syncSecret, Args: sharedServiceArgs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Stop)
	admin := harness.Admin{Base: svc.URL(), Token: adminToken}
	gws := e.fleetOn(t, host, []string{svc.Addr()}, uniqueKey("rules"), 4, tierRules100, false, harness.Sync{})
	n := len(gws)

	ctx := ctxFor(t, time.Minute)
	hd := hostDelay(t)
	stop := make(chan struct{})
	var mu sync.Mutex
	want := "" // the limit whose first appearance is being timed
	seen := make([]time.Time, n)
	var wg sync.WaitGroup
	for i, g := range gws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.client.Run(ctx, harness.Load{
				Gateways: []*harness.Gateway{g}, Path: "/api/quote", Key: uniqueKey(fmt.Sprintf("rules-trickle%d", i)),
				Rate: 50, Duration: time.Hour, Workers: 4, Stop: stop,
				OnAnswer: func(a *harness.Answer) {
					mu.Lock()
					defer mu.Unlock()
					if want != "" && a.Get("X-RateLimit-Limit") == want && seen[i].IsZero() {
						seen[i] = arrival(a)
					}
				},
			})
		}()
	}
	stopTraffic := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopTraffic()

	// A known starting point at the service: 100/min, enforced by every gateway (this
	// also makes the scenario independent of what earlier runs stored).
	v1, err := admin.PutRules([]byte(tierRules100))
	if err != nil {
		t.Fatal(err)
	}
	if err := harness.Poll(10*time.Second, 20*time.Millisecond, func() (bool, error) {
		for _, g := range gws {
			if g.Metric("tollgate.rules_version") != int64(v1) {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("gateways did not adopt rule set version %d: %v", v1, err)
	}

	mu.Lock()
	want = "500"
	mu.Unlock()
	putAt := time.Now()
	v2, err := admin.PutRules([]byte(tierRules500))
	if err != nil {
		t.Fatal(err)
	}
	putTook := time.Since(putAt)
	allErr := harness.Poll(10*time.Second, 10*time.Millisecond, func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		for i := range seen {
			if seen[i].IsZero() {
				return false, nil
			}
		}
		return true, nil
	})
	stopTraffic()

	// Enforcement of the new limit: a fresh key per gateway, 150 requests in 1.5 s. Under
	// the old limit at most 100 + refill (~2) could pass.
	admitted := make([]int, n)
	var ewg sync.WaitGroup
	for i, g := range gws {
		ewg.Add(1)
		go func() {
			defer ewg.Done()
			answers := e.client.Run(ctx, harness.Load{Gateways: []*harness.Gateway{g}, Path: "/api/quote",
				Key: uniqueKey(fmt.Sprintf("rules-new%d", i)), Rate: 100, Count: 150, Workers: 8})
			admitted[i] = harness.Count(answers, 1).OK
		}()
	}
	ewg.Wait()

	var rows [][]string
	var worst time.Duration
	for i, g := range gws {
		d := "-"
		if !seen[i].IsZero() {
			p := seen[i].Sub(putAt)
			worst = max(worst, p)
			d = p.Round(time.Millisecond).String()
		}
		rows = append(rows, []string{g.Name, d, fmt.Sprint(g.Metric("tollgate.rules_version")), fmt.Sprintf("%d / 150", admitted[i])})
	}
	logTable(t, fmt.Sprintf("scenario 5 on %s: PUT /v1/rules 100 → 500/min (version %d → %d, PUT took %v)", host, v1, v2, putTook.Round(100*time.Microsecond)),
		harness.Table([]string{"gateway", "PUT → first answer with limit 500", "rules_version", "fresh key admitted"}, rows))
	t.Logf("slowest gateway %v (requirement %v)", worst.Round(time.Millisecond), requirement)

	if allErr != nil {
		t.Fatalf("not every gateway advertised the new limit: %v", allErr)
	}
	for i, g := range gws {
		if ok, msg := within(hd, putAt, seen[i], requirement); !ok {
			t.Errorf("%s: new limit after %s", g.Name, msg)
		}
		if got := g.Metric("tollgate.rules_version"); got != int64(v2) {
			t.Errorf("%s: rules_version %d, want %d", g.Name, got, v2)
		}
		if admitted[i] <= 110 {
			t.Errorf("%s: a fresh key got %d of 150 admitted: the 500/min limit is not enforced", g.Name, admitted[i])
		}
	}

	// Redis wiped (FLUSHALL: a restore from nothing, a new cluster), then a rule set
	// pushed: its version is newer than what the gateways enforce (versions follow the
	// writer's clock), so every gateway takes it within a second; a counter starting
	// over at 1 would have looked older and been ignored.
	wipe := redis.NewClient(&redis.Options{Addr: rdb.Addrs()[0]})
	defer wipe.Close()
	if err := wipe.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	wipedAt := time.Now()
	v3, err := admin.PutRules([]byte(tierRules100))
	if err != nil {
		t.Fatalf("rule set after the wipe: %v", err)
	}
	if v3 <= v2 {
		t.Fatalf("version %d after the wipe, not above %d", v3, v2)
	}
	if err := pollWithin(hd, time.Second, 10*time.Millisecond, func() (bool, error) {
		for _, g := range gws {
			if g.Metric("tollgate.rules_version") != int64(v3) {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("after the wipe, not every gateway enforces version %d within 1 s: %v", v3, err)
	}
	t.Logf("after FLUSHALL and a new rule set: every gateway on version %d in %v", v3, time.Since(wipedAt).Round(time.Millisecond))

	// An empty rule set does not strand the gateways: with nothing to enforce and
	// nothing to report they still ask every interval (heartbeats), so a real rule set
	// pushed after it is enforced within 300 ms.
	onAll := func(v uint64, bound time.Duration) error {
		return pollWithin(hd, bound, 5*time.Millisecond, func() (bool, error) {
			for _, g := range gws {
				if g.Metric("tollgate.rules_version") != int64(v) {
					return false, nil
				}
			}
			return true, nil
		})
	}
	v4, err := admin.PutRules([]byte(`{"rules":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := onAll(v4, 2*time.Second); err != nil {
		t.Fatalf("the empty rule set (version %d) did not reach every gateway: %v", v4, err)
	}
	realAt := time.Now()
	v5, err := admin.PutRules([]byte(tierRules500))
	if err != nil {
		t.Fatal(err)
	}
	if err := onAll(v5, 300*time.Millisecond); err != nil {
		t.Fatalf("after an empty rule set, version %d not on every gateway within 300 ms: %v", v5, err)
	}
	t.Logf("after an empty rule set: every gateway on version %d in %v", v5, time.Since(realAt).Round(time.Millisecond))
}

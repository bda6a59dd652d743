package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/service"
	"github.com/tollgate-rl/tollgate/shared/rule"
)

const keyHashSecret = "e2e-key-hash-secret"

// TestLevers: the emergency levers on a fleet of 2 gateways × 2 workers behind one
// service with its own Redis Cluster, caller keys hashed in Redis. Each subtest runs
// alone with -run TestLevers/<name>; "degraded" stops the service and runs last.
func TestLevers(t *testing.T) {
	t.Parallel()
	e := sharedEnv(t)
	rc, err := redistest.LaunchCluster(redistest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Stop)
	cfg := e.serviceConfig(sharedServiceArgs...)
	cfg.RedisAddrs, cfg.KeyHashSecret = rc.Addrs(), keyHashSecret
	svc, err := harness.StartService(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Stop)
	admin := harness.Admin{Base: svc.URL(), Token: adminToken}
	// Keys are client IPs from x-forwarded-for (one trusted hop): what key_hashing
	// hashes by default.
	gws := e.fleetOn(t, harness.Wazero, []string{svc.Addr()}, uniqueKey("levers"), 2,
		`{"key":{"source":"ip","trusted_hops":1},"rules":[]}`, false, harness.Sync{})
	var workers []*harness.Client
	for _, g := range gws {
		for w := range 2 {
			c := g.WorkerClient(w)
			t.Cleanup(c.Close)
			workers = append(workers, c)
		}
	}
	base := func(i int) string { return gws[i/2].URL }
	ipOf := func(prefix string, n int) string { return fmt.Sprintf("%s.%d.%d", prefix, n>>8&255, n&255) }
	get := func(c *harness.Client, b, ip string) harness.Answer {
		return c.Get(context.Background(), b, "/levers", "", [2]string{"X-Forwarded-For", ip})
	}
	put := func(t *testing.T, doc string) uint64 {
		t.Helper()
		v, err := admin.PutRules([]byte(doc))
		if err != nil || v == 0 {
			t.Fatalf("PUT /v1/rules: %v (version %d)", err, v)
		}
		return v
	}
	const rules = `"rules":[{"id":"levers","match":{"prefix":"/levers"},"limit":1,"window":"1h","degraded_limit":1}]`

	t.Run("enforcement", func(t *testing.T) {
		onVersion(t, gws, put(t, `{"key":{"source":"ip","trusted_hops":1},`+rules+`}`), "/levers")
		ip := ipOf("198.18", int(time.Now().UnixNano()%60000))
		if a := get(workers[0], base(0), ip); a.Status != 200 {
			t.Fatalf("first request: %d %s", a.Status, a.Body)
		}
		for i, c := range workers {
			if err := harness.Poll(5*time.Second, 10*time.Millisecond, func() (bool, error) {
				return get(c, base(i), ip).Status == 429, nil
			}); err != nil {
				t.Fatalf("worker %d never refused the spent key: %v", i, err)
			}
		}
		for _, lever := range []struct {
			enforcement string
			answer      func(a harness.Answer) bool
		}{
			{"shadow", func(a harness.Answer) bool { return a.Status == 200 && a.Get("X-RateLimit-Shadow") == "levers" }},
			// Under shadow the answer has no limit headers either, but names the rule.
			{"off", func(a harness.Answer) bool {
				return a.Status == 200 && a.Get("X-RateLimit-Limit") == "" && a.Get("X-RateLimit-Shadow") == ""
			}},
			{"on", func(a harness.Answer) bool { return a.Status == 429 }},
		} {
			start := time.Now()
			put(t, `{"enforcement":"`+lever.enforcement+`","key":{"source":"ip","trusted_hops":1},`+rules+`}`)
			took := make([]time.Duration, len(workers))
			var wg sync.WaitGroup
			for i, c := range workers {
				wg.Go(func() {
					if err := harness.Poll(10*time.Second, 5*time.Millisecond, func() (bool, error) {
						return lever.answer(get(c, base(i), ip)), nil
					}); err != nil {
						t.Errorf("enforcement %s: worker %d: %v", lever.enforcement, i, err)
					}
					took[i] = time.Since(start)
				})
			}
			wg.Wait()
			slowest := slices.Max(took)
			// Time to effect is an observation (two sync intervals and two round trips by
			// protocol, then a worker's next tick), reported, not asserted.
			t.Logf("enforcement %s: in effect on every worker of both gateways %v after the PUT (per worker %v)",
				lever.enforcement, slowest.Round(time.Millisecond), took)
		}
	})

	t.Run("rollout", func(t *testing.T) {
		doc := `{"key":{"source":"ip","trusted_hops":1},"rules":[{"id":"canary","match":{"prefix":"/levers"},"limit":1,"window":"1h","rollout_percent":10}]}`
		put(t, doc)
		r := &rule.Rule{ID: "canary", ShadowBP: 9000}
		const keys = 10000
		prefix := "10." + strconv.Itoa(int(time.Now().UnixNano()%200))
		// Every worker enforces the new rule set: a probe from a key inside the rollout
		// (one per worker: each spends its permit) is answered under the canary policy.
		probe := 0
		for i, c := range workers {
			for probe++; !r.RolledOut(ipOf("10.250", probe)); probe++ {
			}
			ip := ipOf("10.250", probe)
			if err := harness.Poll(10*time.Second, 10*time.Millisecond, func() (bool, error) {
				a := get(c, base(i), ip)
				return strings.Contains(a.Get("RateLimit-Policy"), `"canary-1h"`), nil
			}); err != nil {
				t.Fatalf("worker %d never enforced the canary rule: %v", i, err)
			}
		}
		var mu sync.Mutex
		refused, mismatched := 0, 0
		var wg sync.WaitGroup
		for wk := range 8 {
			wg.Go(func() {
				for n := wk; n < keys; n += 8 {
					ip := ipOf(prefix, n)
					c := workers[n%len(workers)]
					first, second := get(c, base(n%len(workers)), ip), get(c, base(n%len(workers)), ip)
					mu.Lock()
					if first.Status != 200 || second.Status != 200 && second.Status != 429 {
						mismatched++
					}
					if second.Status == 429 {
						refused++
					}
					if (second.Status == 429) != r.RolledOut(ip) {
						mismatched++
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		share := float64(refused) / keys * 100
		t.Logf("rollout_percent 10: enforced on %d of %d keys (%.2f %%), %d answers unlike rule.RolledOut", refused, keys, share, mismatched)
		if share < 8 || share > 12 || mismatched > 0 {
			t.Fatalf("enforced on %.2f %% of keys (want 10 ± 2), %d answers unlike rule.RolledOut", share, mismatched)
		}
	})

	t.Run("degraded", func(t *testing.T) {
		doc := `{"key":{"source":"ip","trusted_hops":1},"rules":[{"id":"degraded","match":{"prefix":"/levers"},"limit":1000,"window":"1h","degraded_limit":3}]}`
		onVersion(t, gws, put(t, doc), "/levers")
		svc.Stop()
		for i, c := range workers {
			probe := ipOf("198.19", i)
			if err := harness.Poll(10*time.Second, 20*time.Millisecond, func() (bool, error) {
				a := get(c, base(i), probe)
				return a.Degraded(), nil
			}); err != nil {
				t.Fatalf("worker %d never answered degraded: %v", i, err)
			}
		}
		ip := ipOf("198.19", 1000+int(time.Now().UnixNano()%1000))
		for gi := range gws {
			admitted := 0
			for n := range 10 {
				a := get(workers[gi*2+n%2], gws[gi].URL, ip) // both workers of the gateway
				if a.Status == 200 {
					admitted++
				}
			}
			t.Logf("gateway %d, service down: admitted %d of 10 (degraded_limit 3, limit 1000)", gi, admitted)
			if admitted != 3 {
				t.Errorf("gateway %d admitted %d of 10 while degraded, want the degraded limit 3", gi, admitted)
			}
		}
	})

	// After the run, Redis holds no client IP: every caller key was an IP and is stored
	// as its keyed hash.
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs()})
	defer rdb.Close()
	var keys []string
	var mu sync.Mutex
	err = rdb.ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, "*", 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			keys = append(keys, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	raw, hashed := 0, 0
	for _, k := range keys {
		if strings.Contains(k, "{198.1") || strings.Contains(k, "{10.") { // the IPs this test sent
			raw++
			t.Errorf("Redis key with a raw client IP: %q", k)
		}
		if strings.HasPrefix(k, "tg:{") && !strings.HasPrefix(k, "tg:{fleet}") && len(k) > 20 && k[20] == '}' {
			hashed++
		}
	}
	t.Logf("Redis SCAN after the run: %d keys, %d with a raw IP, %d bucket/penalty keys named by a 16-character hash (e.g. %s)",
		len(keys), raw, hashed, service.HashKey([]byte(keyHashSecret), "198.18.0.1"))
	if hashed == 0 && !t.Failed() {
		t.Errorf("no hashed caller key in Redis: %v", keys)
	}
}

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
	"github.com/tollgate-rl/tollgate/internal/envoyproc"
	"github.com/tollgate-rl/tollgate/internal/redistest"
)

// threePathRules is one rule every path applies: the Wasm filter by its HTTP match
// (keyed by x-api-key), Envoy's rate_limit_quota filter by the bucket the shipped
// deploy/envoy-rlqs.yaml builds ({api_key: x-api-key}, domain tollgate) and Envoy's
// ratelimit filter by the same descriptor.
const threePathRules = `{"rules": [{"id": "three", "limit": 40, "window": "10s",
  "match": {"prefix": "/"}, "key": {"source": "header", "name": "x-api-key"},
  "descriptors": {"domain": "tollgate", "entries": [{"key": "api_key"}]}}]}`

// TestThreePathsOneQuota: one key, one rule, one service on its own Redis, and every
// way a fleet can reach it at once: two real Envoys (newest release, 2 workers each)
// running the compiled Wasm filter and syncing over HTTP, two plain Envoys whose
// rate_limit_quota filter is assigned token buckets over RLQS, and a gRPC client of the
// rate limit service. Each of the five is offered 10 requests a second for 12 s,
// 12.5 times the rule's 4 a second together. What they admit together stays within the
// RLQS path's over-admission bound (RATIONALE.md "Envoy's rate_limit_quota filter": the
// rule's own C + L·T/W, plus C + L·(R + h)/W of staleness and one no-assignment request
// per RLQS Envoy), which also covers the leased paths' cold-start allowances (at most
// C/20 over the fleet, §3); every path admits some of it, and no answer is an error.
func TestThreePathsOneQuota(t *testing.T) {
	t.Parallel()
	const (
		limit, capacity, windowS = 40, 40, 10
		seconds, reportS, hbS    = 12, 5, 1
		rlqsEnvoys, wasmEnvoys   = 2, 2
	)
	e := sharedEnv(t)
	rds, err := redistest.Launch(redistest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rds.Stop)
	grpcAddr := freeAddr(t)
	svc, err := harness.StartService(harness.ServiceConfig{Bin: e.bins.Service, RedisAddrs: rds.Addrs(),
		AdminToken: adminToken, SyncSecret: syncSecret,
		Args: []string{"--rls-listen", grpcAddr, "--penalty-base", "1ms", "--penalty-max", "1ms"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Stop)
	if _, err := (harness.Admin{Base: svc.URL(), Token: adminToken}).PutRules([]byte(threePathRules)); err != nil {
		t.Fatal(err)
	}
	// The fleet the service counts: both kinds of Envoy and its own RLS node.
	wasm := e.fleetOn(t, harness.EnvoyHost(envoyproc.Newest), []string{svc.Addr()}, uniqueKey("three"), wasmEnvoys, threePathRules, true,
		harness.Sync{ExpectedNodes: wasmEnvoys + rlqsEnvoys + 1})
	var rlqs []string
	for range rlqsEnvoys {
		rlqs = append(rlqs, startRLQSEnvoy(t, e.upstream.URL, grpcAddr))
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	rlsClient := rlsv3.NewRateLimitServiceClient(conn)

	key := uniqueKey("sk_three")
	ctx := ctxFor(t, 2*time.Minute)
	paths := []string{"wasm 1", "wasm 2", "rlqs 1", "rlqs 2", "rls"}
	// ask sends one request of path i and reports whether it was admitted; every answer
	// that is neither an admission nor a refusal is an error of the test.
	ask := func(i int) bool {
		switch {
		case i < wasmEnvoys:
			a := e.client.Get(ctx, wasm[i].URL, "/x", key)
			if !a.OK() && a.Status != http.StatusTooManyRequests {
				t.Errorf("%s: status %d (err %v)", paths[i], a.Status, a.Err)
			}
			return a.OK()
		case i < wasmEnvoys+rlqsEnvoys:
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, rlqs[i-wasmEnvoys]+"/x", nil)
			req.Header.Set("X-Api-Key", key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Errorf("%s: %v", paths[i], err)
				return false
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
				t.Errorf("%s: status %d", paths[i], resp.StatusCode)
			}
			return resp.StatusCode == http.StatusOK
		}
		resp, err := shouldRateLimit(ctx, rlsClient, "tollgate", key, 0)
		if err != nil {
			t.Errorf("%s: %v", paths[i], err)
			return false
		}
		return resp.OverallCode == rlsv3.RateLimitResponse_OK
	}

	admitted := make([]int, len(paths))
	start := time.Now()
	var wg sync.WaitGroup
	for i := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for time.Since(start) < seconds*time.Second && ctx.Err() == nil {
				if ask(i) {
					admitted[i]++
				}
				<-tick.C
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	total := 0
	for _, n := range admitted {
		total += n
	}
	ideal := capacity + limit*elapsed/windowS
	bound := 2*capacity + limit*(elapsed+reportS+hbS)/windowS + rlqsEnvoys
	t.Logf("admitted %d over %.1f s by path %v %v: the rule's own bound %.0f, the fleet's %.0f", total, elapsed, paths, admitted, ideal, bound)
	if float64(total) > bound {
		t.Errorf("admitted %d, above the bound %.0f", total, bound)
	}
	for i, n := range admitted {
		if n == 0 {
			t.Errorf("%s admitted nothing: one path starved the others", paths[i])
		}
	}
	// One quota, not three: a path that did not see the others' charges would admit
	// about the rule's own allowance by itself.
	if float64(total) < ideal*0.8 {
		t.Errorf("admitted %d, under 80 %% of the %.0f one bucket allows: the paths refuse callers within the limit", total, ideal)
	}
}

// startRLQSEnvoy starts a plain Envoy (newest release, 2 workers) from the shipped
// deploy/envoy-rlqs.yaml, its backend the suite's upstream and its RLQS cluster the
// service's gRPC listener, and returns the listener's base URL.
func startRLQSEnvoy(t *testing.T, upstream, grpcAddr string) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	bin, err := envoyproc.Binary(root, envoyproc.Newest)
	if err != nil {
		t.Fatal(err)
	}
	listen, err := envoyproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	yaml, err := envoyproc.GRPCServiceConfig(root, "envoy-rlqs.yaml", envoyproc.Shipped{
		Listener: listen, Backend: portOfURL(t, upstream), GRPC: portOfURL(t, "http://"+grpcAddr), SyncSecret: syncSecret})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	proc, err := envoyproc.Start(ctx, envoyproc.Options{Binary: bin, Config: yaml, Dir: t.TempDir(), Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proc.Stop() })
	return fmt.Sprintf("http://127.0.0.1:%d", listen)
}

// portOfURL is the port of a URL on 127.0.0.1.
func portOfURL(t *testing.T, s string) int {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return p
}

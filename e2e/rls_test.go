package e2e

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
	"github.com/tollgate-rl/tollgate/internal/redistest"
)

// rlsRules is one rule both paths apply: the Wasm filter by its HTTP match (keyed by
// x-api-key), Envoy's native filter by its descriptor (api_key = the same key).
const rlsRules = `{"rules": [{"id": "mixed", "limit": 100, "window": "1h",
  "match": {"prefix": "/"}, "key": {"source": "header", "name": "x-api-key"},
  "descriptors": {"domain": "e2e", "entries": [{"key": "api_key"}]}}]}`

// TestRLSAndWasmShareOneQuota: a real gRPC client calls ShouldRateLimit for a key
// while the compiled Wasm filter admits HTTP requests for the same key under the same
// rule, through one service (its own Redis, so the rule set it holds is this test's),
// which decides the gRPC calls from its leases.
// Each path sees what the other spent, and the two together admit no more than one
// limit (100 per hour, token bucket: its capacity plus the refill over the run) plus
// the fleet goal of RATIONALE.md §3 (1 %).
func TestRLSAndWasmShareOneQuota(t *testing.T) {
	t.Parallel()
	e := sharedEnv(t)
	rds, err := redistest.Launch(redistest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rds.Stop)
	rlsAddr := freeAddr(t)
	svc, err := harness.StartService(harness.ServiceConfig{Bin: e.bins.Service, RedisAddrs: rds.Addrs(),
		AdminToken: adminToken, SyncSecret: syncSecret,
		Args: []string{"--rls-listen", rlsAddr, "--penalty-base", "1ms", "--penalty-max", "1ms"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Stop)
	if _, err := (harness.Admin{Base: svc.URL(), Token: adminToken}).PutRules([]byte(rlsRules)); err != nil {
		t.Fatal(err)
	}
	gws := e.fleetOn(t, harness.Wazero, []string{svc.Addr()}, uniqueKey("rls"), 1, rlsRules, true, harness.Sync{})
	gw := gws[0]

	conn, err := grpc.NewClient(rlsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := rlsv3.NewRateLimitServiceClient(conn)
	key := uniqueKey("sk_rls")
	ctx := ctxFor(t, 2*time.Minute)
	start := time.Now()
	rls := func(hits uint32) (*rlsv3.RateLimitResponse, error) {
		return shouldRateLimit(ctx, client, "e2e", key, hits)
	}
	remaining := func(a *harness.Answer) int {
		n, err := strconv.Atoi(a.Get("X-RateLimit-Remaining"))
		if err != nil {
			t.Fatalf("gateway answer %d without x-ratelimit-remaining: %v", a.Status, a.Header)
		}
		return n
	}

	// 1. The gRPC path spends half; the filter's first answer (its acquire goes to the
	// service) shows what is left after it, not a full bucket.
	resp, err := rls(50)
	if err != nil {
		t.Fatal(err)
	}
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 50 {
		t.Fatalf("ShouldRateLimit for 50 of 100: %v remaining %d", resp.OverallCode, resp.Statuses[0].LimitRemaining)
	}
	admitted := 50
	first := e.client.Get(ctx, gw.URL, "/x", key)
	if !first.OK() {
		t.Fatalf("gateway's first request: %d %s", first.Status, first.Body)
	}
	admitted++
	if r := remaining(&first); r > 49 {
		t.Errorf("the filter's remaining after the gRPC path spent 50 of 100 and it admitted 1: %d, want <= 49", r)
	}

	// 2. The filter admits 19 more. The service decides from its lease (a replica is a
	// node of the fleet like the gateway): its remaining is its lease plus what Redis
	// last told it was unreserved, which learns of the filter's 20 at the replica's next
	// reply for the key, so it is at most what it was after its own 50.
	for i := 0; i < 19; i++ {
		if a := e.client.Get(ctx, gw.URL, "/x", key); !a.OK() {
			t.Fatalf("gateway request %d of 20: %d %s", i+2, a.Status, a.Body)
		}
		admitted++
	}
	resp, err = rls(1)
	if err != nil {
		t.Fatal(err)
	}
	if resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit after 70 of 100: %v", resp.OverallCode)
	}
	admitted++
	if r := resp.Statuses[0].LimitRemaining; r > 49 {
		t.Errorf("the gRPC path's remaining after it spent 51 of 100: %d, want <= 49", r)
	}

	// 3. Both paths at once until both refuse: together they admit at most one limit.
	var mu sync.Mutex
	var grpcOK, httpOK, grpcErrs int
	var wg sync.WaitGroup
	deadline := time.Now().Add(30 * time.Second)
	wg.Add(2)
	go func() {
		defer wg.Done()
		for refusedInARow := 0; refusedInARow < 20 && time.Now().Before(deadline); {
			resp, err := rls(1)
			mu.Lock()
			switch {
			case err != nil:
				grpcErrs++
				refusedInARow++
			case resp.OverallCode == rlsv3.RateLimitResponse_OK:
				grpcOK++
				refusedInARow = 0
			default:
				refusedInARow++
			}
			mu.Unlock()
		}
	}()
	go func() {
		defer wg.Done()
		for refusedInARow := 0; refusedInARow < 20 && time.Now().Before(deadline); {
			a := e.client.Get(ctx, gw.URL, "/x", key)
			mu.Lock()
			if a.OK() {
				httpOK++
				refusedInARow = 0
			} else {
				refusedInARow++
			}
			mu.Unlock()
		}
	}()
	wg.Wait()
	span := time.Since(start)
	admitted += grpcOK + httpOK
	allowance := 100 + 100*span.Hours()
	bound := allowance * 1.01
	logTable(t, "gRPC rate limit service and Wasm filter on one key", harness.KV(
		"limit", "100 per hour (token bucket)",
		"before the race: gRPC / filter", "51 / 20",
		"race: gRPC admitted / filter admitted / gRPC errors", fmt.Sprintf("%d / %d / %d", grpcOK, httpOK, grpcErrs),
		"total admitted", fmt.Sprint(admitted),
		"allowance (capacity + refill over the run)", fmt.Sprintf("%.2f (span %v), bound +1%%: %.2f", allowance, span.Round(time.Millisecond), bound),
	))
	if grpcErrs > 0 {
		t.Errorf("%d ShouldRateLimit calls failed", grpcErrs)
	}
	if float64(admitted) > bound {
		t.Errorf("both paths admitted %d, over one limit's bound %.2f", admitted, bound)
	}
	if float64(admitted) < 0.9*allowance {
		t.Errorf("both paths admitted only %d of %.2f: a path refused what the quota held", admitted, allowance)
	}
}

// TestRLSReplicasAndGatewaysOneQuota: two service replicas, each deciding its gRPC
// calls from its own leases, and two gateways running the compiled Wasm filter, all on
// one key of one rule (its own Redis). Callers on all four at once until every one is
// refused: the fleet of four nodes admits at most one limit (its capacity plus the
// refill over the run) plus the cold-start bound of RATIONALE.md §3 (5 %).
func TestRLSReplicasAndGatewaysOneQuota(t *testing.T) {
	t.Parallel()
	e := sharedEnv(t)
	rds, err := redistest.Launch(redistest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rds.Stop)
	var svcAddrs, rlsAddrs []string
	for i := 0; i < 2; i++ {
		addr := freeAddr(t)
		svc, err := harness.StartService(harness.ServiceConfig{Bin: e.bins.Service, RedisAddrs: rds.Addrs(),
			AdminToken: adminToken, SyncSecret: syncSecret,
			Args: []string{"--rls-listen", addr, "--penalty-base", "1ms", "--penalty-max", "1ms"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(svc.Stop)
		if i == 0 {
			if _, err := (harness.Admin{Base: svc.URL(), Token: adminToken}).PutRules([]byte(rlsRules)); err != nil {
				t.Fatal(err)
			}
		}
		svcAddrs, rlsAddrs = append(svcAddrs, svc.Addr()), append(rlsAddrs, addr)
	}
	gws := e.fleetOn(t, harness.Wazero, svcAddrs, uniqueKey("rls2x2"), 2, rlsRules, true, harness.Sync{ExpectedNodes: 4})
	var clients []rlsv3.RateLimitServiceClient
	for _, addr := range rlsAddrs {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		clients = append(clients, rlsv3.NewRateLimitServiceClient(conn))
	}
	key := uniqueKey("sk_rls2x2")
	ctx := ctxFor(t, 2*time.Minute)
	rls := func(c rlsv3.RateLimitServiceClient) (*rlsv3.RateLimitResponse, error) {
		return shouldRateLimit(ctx, c, "e2e", key, 0)
	}
	start := time.Now()
	deadline := start.Add(30 * time.Second)
	var mu sync.Mutex
	admitted := make([]int, 4) // replica 1, replica 2, gateway 1, gateway 2
	var grpcErrs, degraded int
	var wg sync.WaitGroup
	for n := 0; n < 4; n++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for refusedInARow := 0; refusedInARow < 20 && time.Now().Before(deadline); {
				ok := false
				if n < 2 {
					resp, err := rls(clients[n])
					mu.Lock()
					if err != nil {
						grpcErrs++
					} else {
						ok = resp.OverallCode == rlsv3.RateLimitResponse_OK
						for _, h := range resp.ResponseHeadersToAdd {
							if h.Key == "x-ratelimit-policy" && h.Value == "degraded" {
								degraded++
							}
						}
					}
				} else {
					a := e.client.Get(ctx, gws[n-2].URL, "/x", key)
					mu.Lock()
					ok = a.OK()
					if a.Get("X-RateLimit-Policy") == "degraded" {
						degraded++
					}
				}
				if ok {
					admitted[n]++
					refusedInARow = 0
				} else {
					refusedInARow++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	span := time.Since(start)
	total := admitted[0] + admitted[1] + admitted[2] + admitted[3]
	allowance := 100 + 100*span.Hours()
	bound := allowance * 1.05
	logTable(t, "two replicas (gRPC, leases) and two Wasm gateways on one key", harness.KV(
		"limit", "100 per hour (token bucket)",
		"admitted: replica 1 / replica 2 / gateway 1 / gateway 2", fmt.Sprintf("%d / %d / %d / %d", admitted[0], admitted[1], admitted[2], admitted[3]),
		"total admitted", fmt.Sprint(total),
		"gRPC errors / degraded answers", fmt.Sprintf("%d / %d", grpcErrs, degraded),
		"allowance (capacity + refill over the run)", fmt.Sprintf("%.2f (span %v), bound +5%%: %.2f", allowance, span.Round(time.Millisecond), bound),
	))
	if grpcErrs > 0 {
		t.Errorf("%d ShouldRateLimit calls failed", grpcErrs)
	}
	if degraded > 0 {
		t.Logf("%d degraded answers: the fleet bound is for a healthy fleet (RATIONALE.md §3)", degraded)
	} else if float64(total) > bound {
		t.Errorf("the fleet admitted %d, over the bound %.2f", total, bound)
	}
	if float64(total) < 0.9*allowance {
		t.Errorf("the fleet admitted only %d of %.2f: a node refused what the quota held", total, allowance)
	}
}

// freeAddr is a loopback address with a port free at the time of the call.
// shouldRateLimit asks the service's gRPC RLS, authenticated with the sync secret, for
// hits (0: Envoy's default of 1) of one descriptor {api_key: key} in domain.
func shouldRateLimit(ctx context.Context, c rlsv3.RateLimitServiceClient, domain, key string, hits uint32) (*rlsv3.RateLimitResponse, error) {
	cctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+syncSecret), 5*time.Second)
	defer cancel()
	return c.ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits,
		Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: key}}}}})
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

//go:build !wasip1

package main

import (
	"context"
	"testing"

	"github.com/tetratelabs/wazero/api"

	"github.com/tollgate-rl/tollgate/filter/wasmtest"
	wasmhost "github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// Configurations of the steady-state allocation test: every request of allocRequest is
// admitted (the limits are never reached) by one rule, or by three rules with different
// algorithms, windows and keys.
const (
	allocOneRule = `{"key":{"source":"header","name":"x-api-key"},
		"rules":[{"id":"api","limit":1000000,"window":"1s"}]}`
	allocThreeRules = `{"key":{"source":"header","name":"x-api-key"},
		"rules":[{"id":"api","limit":1000000,"window":"1s"},
		         {"id":"search","match":{"prefix":"/v1/search","methods":["GET"]},"algorithm":"gcra","limit":1000000,"window":"1s","burst":1000000},
		         {"id":"tenant","key":{"source":"header","name":"x-tenant"},"algorithm":"sliding_window_counter","limit":1000000,"window":"10s"}]}`
	// allocConditions matches on host, path prefix, a header, a query parameter and a
	// negated method, keyed by tenant:user from jwt_authn's dynamic metadata.
	allocConditions = `{"rules":[{"id":"tenant-user","limit":1000000,"window":"1s",
		"match":{"hosts":["api.example.com"],"prefix":"/v1","headers":[{"name":"x-tenant","exact":"acme"}],"query":[{"name":"q"}],"not":{"methods":["DELETE"]}},
		"key":{"source":"composite","parts":[{"source":"metadata","namespace":"envoy.filters.http.jwt_authn","path":"my_payload.tenant"},
		                                     {"source":"metadata","namespace":"envoy.filters.http.jwt_authn","path":"my_payload.sub","lowercase":true}]}}]}`
	// allocLevers: a rollout that enforces the caller (k-alloc is in the 90 %), a degraded
	// limit, and a rule the caller is outside the rollout of (shadowed).
	allocLevers = `{"key":{"source":"header","name":"x-api-key"},
		"rules":[{"id":"api","limit":1000000,"window":"1s","rollout_percent":90,"degraded_limit":10},
		         {"id":"canary","limit":1000000,"window":"1s","rollout_percent":1}]}`
	// allocInFlight: a slot taken when the request is admitted and given back when its
	// stream ends, on a rule with a rate limit too.
	allocInFlight = `{"key":{"source":"header","name":"x-api-key"},
		"rules":[{"id":"api","limit":1000000,"window":"1s","max_in_flight":1000}]}`
)

func allocRequest() *wasmhost.Request {
	return &wasmhost.Request{Method: "GET", Path: "/v1/search?q=tollgate", Authority: "api.example.com",
		Header: []wasmhost.Pair{
			{"user-agent", "tollgate-test/1"},
			{"accept", "application/json"},
			{"x-api-key", "k-alloc"},
			{"x-tenant", "acme"},
			{"x-request-id", "7d1b5c1e-3a4f-4c1e-9b7a-2f6c1d0e8a11"},
		},
		RemoteAddr: "10.1.2.3:50123", LocalAddr: "10.0.0.1:8080",
		Metadata: wasmhost.Metadata{wasmhost.JWTAuthnFilter: {"my_payload": map[string]any{"tenant": "acme", "sub": "User-1"}}}}
}

// TestGuestHeapAllocations counts the Go heap allocations the compiled module makes per
// admitted request in steady state, read from the module's own runtime (a test build
// that exports runtime.MemStats.Mallocs), and the buffers the host asks the module for
// (proxy_on_memory_allocate). A request path that allocates makes the module's garbage
// collector run under load, which costs time on every worker and, on hosts that answer
// the runtime's poll_oneoff with an error, the VM itself.
func TestGuestHeapAllocations(t *testing.T) {
	wasm := wasmtest.BuildWasmTags(t, "./filter", "tollgate_heapstats")
	for _, tc := range []struct {
		name   string
		config string
		// buckets is the request's shared-data reads and props its property reads: each
		// value the host returns needs one proxy_on_memory_allocate, and the request
		// headers one more.
		buckets, props int
	}{
		{"one rule", allocOneRule, 1, 0},
		{"three rules", allocThreeRules, 3, 0},
		{"match conditions and metadata key", allocConditions, 1, 2},
		{"levers", allocLevers, 2, 0},
		// The bucket, the slot's record when it is taken and again when it is given back.
		{"max in flight", allocInFlight, 3, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := wasmhost.New(wasmhost.Config{Wasm: wasm, PluginConfig: []byte(tc.config), Workers: 1,
				LogLevel: wasmhost.LogWarn, CountHostCalls: true})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			req, up := allocRequest(), &wasmhost.Response{Status: 200}
			exchange := func(n int) {
				t.Helper()
				for i := 0; i < n; i++ {
					r, err := h.Exchange(0, req, up)
					if err != nil || r.Status != 200 || r.Get("ratelimit-policy") == "" {
						t.Fatalf("request %d: %v, %+v", i, err, r)
					}
				}
			}
			readAllocs := func() (n uint64) {
				h.CallOnVM(0, func(ctx context.Context, mod api.Module) {
					res, err := mod.ExportedFunction("tollgate_heap_allocs").Call(ctx)
					if err != nil {
						t.Fatalf("tollgate_heap_allocs: %v", err)
					}
					n = res[0]
				})
				return n
			}
			exchange(2000) // buckets created, buffers grown
			const n = 10_000
			calls0, allocs0 := h.HostCalls(), readAllocs()
			exchange(n)
			calls1, allocs1 := h.HostCalls(), readAllocs()
			perReq := float64(allocs1-allocs0) / n
			hostAllocs := float64(calls1["proxy_on_memory_allocate"]-calls0["proxy_on_memory_allocate"]) / n
			t.Logf("guest heap allocations %.3f per request, host→guest allocations %.2f per request", perReq, hostAllocs)
			if allocs1 != allocs0 {
				t.Errorf("%d guest heap allocations in %d steady-state requests (%.3f per request), want 0", allocs1-allocs0, n, perReq)
			}
			if want := float64(1 + tc.buckets + tc.props); hostAllocs > want {
				t.Errorf("%.2f host→guest allocations per request, want at most %.0f", hostAllocs, want)
			}
		})
	}
}

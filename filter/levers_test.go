//go:build !wasip1

package main

import (
	"strconv"
	"testing"
	"time"

	wasmhost "github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// TestLeversCompiled runs the levers and gRPC refusals through the compiled filter in
// the e2e host: what a client sees for each request of a sequence, the gRPC ones
// answered trailers-only (HTTP 200, grpc-status) with the rate-limit headers.
func TestLeversCompiled(t *testing.T) {
	type step struct {
		grpc       bool
		status     int    // HTTP status the client sees
		grpcStatus string // grpc-status header ("" : none)
		headers    []string
		absent     []string
	}
	rl := []string{"x-ratelimit-limit", "x-ratelimit-remaining", "ratelimit-policy"}
	refused := append([]string{"retry-after", "x-ratelimit-rule"}, rl...)
	for _, tc := range []struct {
		name, config string
		down         bool // sync configured to a cluster that never answers
		steps        []step
	}{
		{"grpc", `{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"api","limit":2,"window":"1m"}]}`, false, []step{
			{grpc: true, status: 200, headers: rl},
			{grpc: true, status: 200, headers: rl},
			{grpc: true, status: 200, grpcStatus: "8", headers: append([]string{"grpc-message"}, refused...)},
			{grpc: false, status: 429, headers: refused, absent: []string{"grpc-status"}},
		}},
		{"enforcement shadow", `{"enforcement":"shadow","key":{"source":"header","name":"x-api-key"},"rules":[{"id":"api","limit":1,"window":"1m"}]}`, false, []step{
			{status: 200},
			{status: 200, headers: []string{"x-ratelimit-shadow"}},
			{grpc: true, status: 200, headers: []string{"x-ratelimit-shadow"}, absent: []string{"grpc-status"}},
		}},
		{"enforcement off", `{"enforcement":"off","key":{"source":"header","name":"x-api-key"},"rules":[{"id":"api","limit":1,"window":"1m"}]}`, false, []step{
			{status: 200, absent: rl},
			{status: 200, absent: rl},
		}},
		{"degraded limit", `{"key":{"source":"header","name":"x-api-key"},
			"sync":{"cluster":"nowhere","interval_ms":20,"timeout_ms":20,"breaker_failures":1},
			"rules":[{"id":"api","limit":5,"window":"1m","degraded_limit":2}]}`, true, []step{
			{status: 200, headers: rl},
			{status: 200, headers: rl},
			{status: 429, headers: refused},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := wasmhost.Config{PluginConfig: []byte(tc.config)}
			if tc.down {
				cfg.Clusters = map[string][]string{"nowhere": {"127.0.0.1:1"}}
			}
			h := newGateway(t, cfg)
			if tc.down {
				// Wait until the gateway counts the service down (every request degraded).
				deadline := time.Now().Add(5 * time.Second)
				for h.Metrics()["tollgate.sync_failed"] == 0 && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				time.Sleep(100 * time.Millisecond)
			}
			for i, st := range tc.steps {
				req := keyRequest("/v1/x", "k1")
				if st.grpc {
					req.Method = "POST"
					req.Header = append(req.Header, wasmhost.Pair{"content-type", "application/grpc"})
				}
				r := h.HandleOn(0, req)
				if r.Status != st.status || r.Get("grpc-status") != st.grpcStatus {
					t.Fatalf("request %d: status %d grpc-status %q, want %d %q (%v %s)", i, r.Status, r.Get("grpc-status"), st.status, st.grpcStatus, r.Header, r.Body)
				}
				if st.grpcStatus != "" && (r.Get("content-type") != "application/grpc" || len(r.Body) != 0) {
					t.Errorf("request %d: gRPC refusal with content-type %q and %d body bytes, want application/grpc trailers-only", i, r.Get("content-type"), len(r.Body))
				}
				for _, name := range st.headers {
					if r.Get(name) == "" {
						t.Errorf("request %d: no %s in %v", i, name, r.Header)
					}
				}
				for _, name := range st.absent {
					if r.Get(name) != "" {
						t.Errorf("request %d: %s present: %v", i, name, r.Header)
					}
				}
				if tc.name == "degraded limit" && r.Get("x-ratelimit-limit") != strconv.Itoa(2) {
					t.Errorf("request %d: x-ratelimit-limit %q while degraded, want the degraded limit 2", i, r.Get("x-ratelimit-limit"))
				}
			}
		})
	}
}

package rls

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/envoyproc"
)

// envoyRLSRules is the rule set deploy/envoy-rls.yaml's comment gives for its actions.
const envoyRLSRules = `{"rules": [
  {"id": "plan", "limit": 5, "window": "1h", "match": {"prefix": "/"},
   "descriptors": {"domain": "tollgate", "entries": [{"key": "api_key"}]}},
  {"id": "search", "limit": 3, "window": "1h",
   "descriptors": {"domain": "tollgate", "entries": [{"key": "route", "value": "search"}, {"key": "api_key"}]}}
]}`

// TestThroughEnvoysFilter: the shipped deploy/envoy-rls.yaml (Envoy's native rate limit
// filter, failure_mode_deny: false) in front of this service. A client controls the
// x-api-key header, and so the descriptor value: a value longer than any bound, and an
// empty one, are limited like any other key. An error answer here would let Envoy admit
// the request with no limit.
func TestThroughEnvoysFilter(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin, err := envoyproc.Binary(root, envoyproc.Newest)
	if err != nil {
		t.Fatal(err) // fails, not skips: `make envoy` installs it
	}
	e := start(t, opts{})
	e.putRules(t, envoyRLSRules)
	rlsAddr := e.addr
	backend, stopBackend, err := envoyproc.Upstream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopBackend)
	listen, err := envoyproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	yaml, err := envoyproc.GRPCServiceConfig(root, "envoy-rls.yaml", envoyproc.Shipped{
		Listener: listen, Backend: portOf(t, backend), GRPC: portOf(t, rlsAddr), SyncSecret: secret})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	proc, err := envoyproc.Start(ctx, envoyproc.Options{Binary: bin, Config: yaml, Dir: t.TempDir(), Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proc.Stop() })
	base := "http://127.0.0.1:" + strconv.Itoa(listen)
	get := func(path, key string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		req.Header["X-Api-Key"] = []string{key} // set as is, empty included
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tt := range []struct {
		name, path, key string
		limit           int
	}{
		{"value of 257 bytes", "/x", uniq("k") + strings.Repeat("v", 257), 5},
		{"value of 8 KiB", "/x", uniq("k") + strings.Repeat("v", 8<<10), 5},
		// Two descriptors of the long value (search and plan): the smaller limit holds.
		{"value of 8 KiB on a route of two descriptors", "/search", uniq("k") + strings.Repeat("v", 8<<10), 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for i := 1; i <= tt.limit+1; i++ {
				want := http.StatusOK
				if i > tt.limit {
					want = http.StatusTooManyRequests
				}
				if got := get(tt.path, tt.key); got != want {
					t.Fatalf("request %d: %d, want %d (limit %d)", i, got, want, tt.limit)
				}
			}
		})
	}
	t.Run("empty value", func(t *testing.T) {
		// Every empty key is one caller: the package's Redis is shared, so it is refused
		// within the limit's six requests, whatever earlier runs left.
		for i := 1; i <= 6; i++ {
			if get("/x", "") == http.StatusTooManyRequests {
				return
			}
		}
		t.Fatal("six requests with an empty x-api-key all admitted, limit 5")
	})
	if n := testutilCount(e, "invalid"); n != 0 {
		t.Errorf("%v calls answered INVALID_ARGUMENT", n)
	}
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

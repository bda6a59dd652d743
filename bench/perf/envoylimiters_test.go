package perf

import (
	"encoding/json"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
	"github.com/tollgate-rl/tollgate/filter/wasmtest"
	"github.com/tollgate-rl/tollgate/internal/envoyproc"
	"github.com/tollgate-rl/tollgate/shared/rule"
)

// shippedForTest is the shipped envoy.yaml with its addresses substituted.
func shippedForTest(t *testing.T) []byte {
	t.Helper()
	root, err := wasmbuild.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	yaml, err := os.ReadFile(filepath.Join(root, "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// The validation loads the module and starts the plugin with its configuration, so
	// the filter itself checks the comparison's rule set.
	wasm := filepath.Join(t.TempDir(), "filter.wasm")
	if err := os.WriteFile(wasm, wasmtest.BuildWasm(t, FilterPkg), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := envoyproc.ShippedConfig(yaml, envoyproc.Shipped{Listener: 10000, Backend: 8080, Sync: 8081, Wasm: wasm, SyncSecret: SyncSecret})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestLimiterConfig checks what each bootstrap holds and, where Envoy is installed,
// that Envoy 1.40 accepts it (envoy --mode validate): a configuration the comparison
// would measure wrongly, or not start, fails here first.
func TestLimiterConfig(t *testing.T) {
	cfg := shippedForTest(t)
	cases := []struct {
		l         Limiter
		want, not []string
	}{
		{PassThrough, []string{"envoy.filters.http.router"}, []string{"envoy.filters.http.wasm", "ratelimit.v3"}},
		{LocalRateLimit, []string{"local_ratelimit.v3.LocalRateLimit", `value: ""`, "max_dynamic_descriptors", "header_name: x-api-key"}, []string{"envoy.filters.http.wasm"}},
		{TollgateLocal, []string{"envoy.filters.http.wasm", `"x-api-key"`, `"bench"`}, []string{`"sync"`, `"tiers"`, "local_ratelimit"}},
		{TollgateSynced, []string{"envoy.filters.http.wasm", `"sync"`, `"tollgate_ratelimit"`, SyncSecret}, []string{`"tiers"`}},
		{RLSPath, []string{"envoy.filters.http.ratelimit", "tollgate_rls", "port_value: 18083}", "Bearer " + SyncSecret, "descriptor_key: api_key", "http2_protocol_options"}, []string{"envoy.filters.http.wasm", "generic_key"}},
		{FloorModule, []string{"envoy.filters.http.wasm"}, nil},
	}
	root, _ := wasmbuild.RepoRoot()
	bin, binErr := envoyproc.Binary(root, envoyproc.Newest)
	for _, c := range cases {
		t.Run(c.l.Short(), func(t *testing.T) {
			out, err := LimiterConfig(c.l, cfg, 18083)
			if err != nil {
				t.Fatal(err)
			}
			s := string(out)
			for _, w := range c.want {
				if !strings.Contains(s, w) {
					t.Errorf("no %q in the bootstrap", w)
				}
			}
			for _, n := range c.not {
				if strings.Contains(s, n) {
					t.Errorf("%q in the bootstrap", n)
				}
			}
			if !strings.Contains(s, "access_log:") {
				t.Error("the shipped access log is gone")
			}
			if binErr != nil {
				t.Logf("envoy not validated: %v", binErr)
				return
			}
			path := filepath.Join(t.TempDir(), "envoy.yaml")
			if err := os.WriteFile(path, out, 0o644); err != nil {
				t.Fatal(err)
			}
			if msg, err := exec.Command(bin, "--mode", "validate", "-c", path).CombinedOutput(); err != nil {
				t.Fatalf("envoy --mode validate: %v\n%s", err, msg)
			}
		})
	}
}

// TestCompareRules: the service's rule set parses and has the one rule, selected both by
// path and by the RLS descriptor.
func TestCompareRules(t *testing.T) {
	var doc struct {
		Key   map[string]string `json:"key"`
		Rules []json.RawMessage `json:"rules"`
	}
	if err := json.Unmarshal(CompareRules(), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Rules) != 1 || doc.Key["name"] != "x-api-key" {
		t.Fatalf("rule set %s", CompareRules())
	}
	if _, err := rule.Parse(CompareRules()); err != nil {
		t.Fatalf("rule set does not parse: %v", err)
	}
}

// TestEnvoyCompareEngages runs the real-Envoy comparison briefly with one worker: every
// limiter's Envoy answers, none with a transport error, and each limiter's own counters
// show it decided the requests (local_ratelimit's ok, the ratelimit filter's ok answers
// from the RLS, the filter's allowed requests), so no row measures a limiter that is
// configured but never runs.
func TestEnvoyCompareEngages(t *testing.T) {
	if testing.Short() {
		t.Skip("starts six Envoys, a Redis and the service (about a minute)")
	}
	bin, err := BuildService(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c, err := MeasureEnvoyCompare(wasmtest.BuildWasm(t, FilterPkg), wasmtest.BuildWasm(t, FloorPkg), bin, CompareOptions{
		Workers: []int{1}, Keys: 1000, Conns: 8, Warmup: 500 * time.Millisecond, Chunk: 500 * time.Millisecond, Rounds: 1,
		Fractions: []float64{0.1}, Target: 0.1, TargetRounds: 1, OpenChunk: 500 * time.Millisecond, OpenWarmup: 100 * time.Millisecond,
		Log: log.New(io.Discard, "", 0),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range Limiters {
		row := c.Row(l, 1)
		if row == nil || len(row.Closed) != 1 || len(row.Open) != 1 {
			t.Fatalf("%s: row %+v", l, row)
		}
		if cr := row.Closed[0]; cr.Requests == 0 || cr.Errors != 0 {
			t.Errorf("%s: closed loop %d requests, %d errors", l, cr.Requests, cr.Errors)
		}
		if o := row.Open[0]; o.Checks == 0 || o.Errors != 0 {
			t.Errorf("%s: open loop %d requests, %d errors (%s)", l, o.Checks, o.Errors, o.FirstErr)
		}
		want := map[Limiter]string{LocalRateLimit: "http_local_rate_limit.ok=", RLSPath: "ratelimit.ok=",
			TollgateLocal: "tollgate.requests_allowed=", TollgateSynced: "tollgate.requests_allowed="}[l]
		if want == "" {
			continue
		}
		decided := false
		for _, s := range row.Stats {
			decided = decided || (strings.Contains(s, want) && !strings.HasSuffix(s, "=0"))
		}
		if !decided {
			t.Errorf("%s: no %q counter above 0 in %v", l, want, row.Stats)
		}
	}
}

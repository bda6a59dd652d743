package perf

import (
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/wasmtest"
	"github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// TestNativeRowDecidesLikeTheModule checks that the native row of the decision cost runs
// the decision the module runs: the same request headers reach the plugin, and both
// answer with the same rate-limit headers (the remaining count aside, which each run's
// own bucket sets).
func TestNativeRowDecidesLikeTheModule(t *testing.T) {
	config := LocalConfig("token_bucket", 1_000_000)
	h, err := wazerohost.New(wazerohost.Config{Wasm: wasmtest.BuildWasm(t, FilterPkg), PluginConfig: config, Workers: 1, LogLevel: wazerohost.LogWarn})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	resp, err := h.Exchange(0, BenchRequest("k-bench"), UpstreamOK)
	if err != nil || resp.Status != 200 {
		t.Fatalf("module: %v, %+v", err, resp)
	}
	want := map[string]string{}
	for _, p := range resp.Header {
		if k := strings.ToLower(p[0]); strings.Contains(k, "ratelimit") && k != "x-ratelimit-remaining" && k != "ratelimit" {
			want[k] = p[1]
		}
	}
	if len(want) < 2 {
		t.Fatalf("the module's answer has no rate-limit headers: %v", resp.Header)
	}

	nh, headers, err := nativeHost(CostModule{Config: config, Native: true})
	if err != nil {
		t.Fatal(err)
	}
	s := nh.Request(0, headers, nil)
	if s.Status() != 200 {
		t.Fatalf("native: status %d", s.Status())
	}
	got := map[string]string{}
	for k := range want {
		got[k] = s.Header(k)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: native %q, module %q", k, got[k], v)
		}
	}

	costs, err := MeasureCosts([]CostModule{{Name: "native", Config: config, Native: true}}, CostOptions{Rounds: 2, Round: 20 * time.Millisecond, Profile: true})
	if err != nil {
		t.Fatal(err)
	}
	if c := costs[0]; !c.Native || c.NsPerRequest <= 0 || len(c.RoundsNs) != 2 || c.GuestNsPerRequest != 0 || c.HostCalls != nil || c.Status != 200 {
		t.Fatalf("native cost: %+v", c)
	}
}

package harness

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/deploy"
)

// TestEnvoyConfigFrom: the shipped envoy.yaml rewritten for a test changes only what it
// must — addresses, ports, the module's path, the plugin configuration, the clusters'
// endpoints — and stays a bootstrap deploy.CheckEnvoy accepts; with LDS the listener
// moves to the LDS file unchanged otherwise.
func TestEnvoyConfigFrom(t *testing.T) {
	shipped, err := ShippedEnvoyYAML()
	if err != nil {
		t.Fatal(err)
	}
	orig, err := deploy.CheckEnvoy(shipped)
	if err != nil {
		t.Fatal(err)
	}
	plugin := []byte(`{"rules":[{"id":"x","limit":1,"window":"1m"}]}`)
	b := EnvoyBootstrap{Wasm: "/tmp/f.wasm", Plugin: plugin, Services: []string{"127.0.0.1:7001", "127.0.0.1:7002"},
		Upstream: "127.0.0.1:7003", FailurePolicy: "FAIL_CLOSED"}
	out, lds, err := EnvoyConfigFrom(shipped, b)
	if err != nil {
		t.Fatal(err)
	}
	if lds != nil {
		t.Fatal("LDS file without LDS")
	}
	got, err := deploy.CheckEnvoy(out)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.RulesJSON) != string(plugin) {
		t.Errorf("plugin configuration %s, want %s", got.RulesJSON, plugin)
	}
	if f := got.Filter.GetConfig().GetVmConfig().GetCode().GetLocal().GetFilename(); f != b.Wasm {
		t.Errorf("module path %q", f)
	}
	if rt := got.Filter.GetConfig().GetVmConfig().GetRuntime(); rt != "envoy.wasm.runtime.v8" {
		t.Errorf("runtime %q", rt)
	}
	if got.Filter.GetConfig().GetFailurePolicy().String() != "FAIL_CLOSED" || orig.Filter.GetConfig().GetFailurePolicy().String() != "FAIL_OPEN" {
		t.Errorf("failure policy %v (shipped %v)", got.Filter.GetConfig().GetFailurePolicy(), orig.Filter.GetConfig().GetFailurePolicy())
	}
	// Everything else as shipped: the stats tags, the access log, the clusters' settings.
	if a, b := got.Bootstrap.GetStatsConfig().String(), orig.Bootstrap.GetStatsConfig().String(); a != b {
		t.Errorf("stats_config changed: %s", a)
	}
	for i, c := range got.Bootstrap.GetStaticResources().GetClusters() {
		o := orig.Bootstrap.GetStaticResources().GetClusters()[i]
		if c.GetConnectTimeout().AsDuration() != o.GetConnectTimeout().AsDuration() || c.GetOutlierDetection().String() != o.GetOutlierDetection().String() {
			t.Errorf("cluster %s: settings changed", c.GetName())
		}
	}
	js, _ := json.Marshal(got.Bootstrap.GetStaticResources().GetClusters())
	for _, want := range []string{"7001", "7002", "7003"} {
		if !strings.Contains(string(js), want) {
			t.Errorf("clusters do not name port %s", want)
		}
	}

	b.LDS, b.ListenPort = "/tmp/lds.json", 7004
	out, lds, err = EnvoyConfigFrom(shipped, b)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `"lds_config"`) || strings.Contains(string(out), `"listeners"`) {
		t.Errorf("LDS bootstrap: %s", out)
	}
	for _, want := range []string{`"@type":"type.googleapis.com/envoy.config.listener.v3.Listener"`, `"port_value":7004`, "envoy.filters.http.wasm"} {
		if !strings.Contains(string(lds), want) {
			t.Errorf("LDS file has no %s", want)
		}
	}
}

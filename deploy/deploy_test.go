package deploy

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	filelogv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	extensionsv1alpha1 "istio.io/api/extensions/v1alpha1"

	"github.com/tollgate-rl/tollgate/filter/plugin"
	"github.com/tollgate-rl/tollgate/internal/wazerohost"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/rule"
)

const (
	envoyFile  = "../envoy.yaml"
	pluginFile = "../plugin.yaml"
	// istioSyncCluster is the cluster Istio builds for port 8081 of the Service
	// tollgate-ratelimit in namespace tollgate (pilot/pkg/model BuildSubsetKey).
	istioSyncCluster = "outbound|8081||tollgate-ratelimit.tollgate.svc.cluster.local"
)

func readFile(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestEnvoyYAML(t *testing.T) {
	e, err := CheckEnvoy(readFile(t, envoyFile))
	if err != nil {
		t.Fatal(err)
	}
	if a := e.Bootstrap.GetAdmin().GetAddress().GetSocketAddress(); a.GetAddress() != "127.0.0.1" || a.GetPortValue() != 9901 {
		t.Errorf("admin listens on %s:%d, want 127.0.0.1:9901", a.GetAddress(), a.GetPortValue())
	}
	ls := e.Bootstrap.GetStaticResources().GetListeners()
	if len(ls) != 1 || ls[0].GetAddress().GetSocketAddress().GetPortValue() != 10000 {
		t.Errorf("want one listener on port 10000, got %d listeners", len(ls))
	}
	cfg := e.Filter.GetConfig()
	vm := cfg.GetVmConfig()
	for _, c := range []struct{ what, got, want string }{
		{"root_id", cfg.GetRootId(), RootID},
		{"vm_id", vm.GetVmId(), "tollgate"},
		{"runtime", vm.GetRuntime(), "envoy.wasm.runtime.v8"},
		{"code file", vm.GetCode().GetLocal().GetFilename(), "/etc/envoy/filter.wasm"},
		{"configuration type", cfg.GetConfiguration().GetTypeUrl(), "type.googleapis.com/google.protobuf.StringValue"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.what, c.got, c.want)
		}
	}
	if p := cfg.GetFailurePolicy(); p != wasmv3.FailurePolicy_FAIL_OPEN {
		t.Errorf("failure_policy = %v, want FAIL_OPEN (a limiter must not become the outage)", p)
	}
	if got := e.Rules.Sync.Cluster; got != "tollgate_ratelimit" {
		t.Errorf("sync.cluster = %q, want tollgate_ratelimit", got)
	}
	for _, c := range e.Bootstrap.GetStaticResources().GetClusters() {
		if c.GetName() != e.Rules.Sync.Cluster {
			continue
		}
		if d := c.GetConnectTimeout().AsDuration(); d != 250*time.Millisecond {
			t.Errorf("sync cluster connect_timeout = %v, want 250ms", d)
		}
		port := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue()
		if port != 8081 {
			t.Errorf("sync cluster port = %d, want 8081 (the service's default)", port)
		}
		if c.GetCircuitBreakers() == nil || c.GetOutlierDetection() == nil {
			t.Error("sync cluster has no circuit breaker or outlier detection")
		}
	}
	checkExampleRules(t, e.Rules)
}

// TestEnvoyTelemetry: envoy.yaml's stats tag is the filter's (its per-rule stats become
// one series per rule with a rule label) and its access log prints the filter's decision
// in the format the project's gateway writes by default.
func TestEnvoyTelemetry(t *testing.T) {
	e, err := CheckEnvoy(readFile(t, envoyFile))
	if err != nil {
		t.Fatal(err)
	}
	var regex string
	for _, tag := range e.Bootstrap.GetStatsConfig().GetStatsTags() {
		if tag.GetTagName() == "rule" {
			regex = tag.GetRegex()
		}
	}
	if regex != plugin.RuleStatsTagRegex {
		t.Fatalf("stats tag rule has regex %q, want the filter's %q", regex, plugin.RuleStatsTagRegex)
	}
	re := regexp.MustCompile(regex)
	if m := re.FindStringSubmatch("wasmcustom.rule=.=v2-burst;.;tollgate.rule.limited"); m == nil || m[2] != "v2-burst" {
		t.Fatalf("the rule tag does not extract the rule from a per-rule stat: %q", m)
	}
	var formats []string
	for _, l := range e.Bootstrap.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig().UnmarshalTo(hcm) != nil {
					continue
				}
				for _, al := range hcm.GetAccessLog() {
					fl := &filelogv3.FileAccessLog{}
					if err := al.GetTypedConfig().UnmarshalTo(fl); err != nil {
						t.Fatal(err)
					}
					formats = append(formats, fl.GetLogFormat().GetTextFormatSource().GetInlineString())
				}
			}
		}
	}
	if len(formats) != 1 || formats[0] != wazerohost.DefaultAccessLogFormat {
		t.Fatalf("access log formats %q, want one: the gateway's %q", formats, wazerohost.DefaultAccessLogFormat)
	}
	if !strings.Contains(formats[0], "%FILTER_STATE(wasm."+plugin.DecisionProperty+":PLAIN)%") {
		t.Fatalf("the access log does not print the filter's decision")
	}
}

func TestPluginYAML(t *testing.T) {
	is, err := CheckIstio(readFile(t, pluginFile))
	if err != nil {
		t.Fatal(err)
	}
	p := is.Plugin
	if p.GetPhase() != extensionsv1alpha1.PluginPhase_AUTHZ {
		t.Errorf("phase = %v, want AUTHZ (after JWT verification, before authorization)", p.GetPhase())
	}
	if p.GetFailStrategy() != extensionsv1alpha1.FailStrategy_FAIL_OPEN {
		t.Errorf("failStrategy = %v, want FAIL_OPEN", p.GetFailStrategy())
	}
	if p.GetPluginName() != RootID {
		t.Errorf("pluginName = %q, want %q", p.GetPluginName(), RootID)
	}
	if p.GetType() != extensionsv1alpha1.PluginType_HTTP {
		t.Errorf("type = %v, want HTTP", p.GetType())
	}
	if len(p.GetSelector().GetMatchLabels()) == 0 {
		t.Error("no selector: the plugin would apply to every workload of its namespace")
	}
	if !strings.HasPrefix(p.GetUrl(), "oci://") && !strings.HasPrefix(p.GetUrl(), "file://") {
		t.Errorf("url = %q, want oci:// or file://", p.GetUrl())
	}
	if got := is.Rules.Sync.Cluster; got != istioSyncCluster {
		t.Errorf("sync.cluster = %q, want %q", got, istioSyncCluster)
	}
	if len(is.DestinationRules) != 1 {
		t.Fatalf("want one DestinationRule, got %d", len(is.DestinationRules))
	}
	dr := is.DestinationRules[0]
	if dr.GetHost() != is.SyncHost || is.SyncPort != 8081 {
		t.Errorf("DestinationRule host %q, sync cluster host %q port %d: they must name the same service", dr.GetHost(), is.SyncHost, is.SyncPort)
	}
	od := dr.GetTrafficPolicy().GetOutlierDetection()
	if !od.GetSplitExternalLocalOriginErrors() || od.GetConsecutive_5XxErrors().GetValue() != 0 {
		t.Error("outlier detection must eject on connection failures only, not on the service's 503s")
	}
	if d := dr.GetTrafficPolicy().GetConnectionPool().GetTcp().GetConnectTimeout().AsDuration(); d != 250*time.Millisecond {
		t.Errorf("connectTimeout = %v, want 250ms", d)
	}
	checkExampleRules(t, is.Rules)
}

// TestSameRules keeps the two examples from drifting apart: apart from sync, which names
// the service the way each proxy does, they carry one rule set.
func TestSameRules(t *testing.T) {
	e, err := CheckEnvoy(readFile(t, envoyFile))
	if err != nil {
		t.Fatal(err)
	}
	is, err := CheckIstio(readFile(t, pluginFile))
	if err != nil {
		t.Fatal(err)
	}
	a, b := withoutSync(t, e.RulesJSON), withoutSync(t, is.RulesJSON)
	if !reflect.DeepEqual(a, b) {
		ja, _ := json.MarshalIndent(a, "", " ")
		jb, _ := json.MarshalIndent(b, "", " ")
		t.Errorf("envoy.yaml and plugin.yaml carry different rules\nenvoy.yaml:\n%s\nplugin.yaml:\n%s", ja, jb)
	}
}

func withoutSync(t *testing.T, js []byte) map[string]any {
	t.Helper()
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber() // 100 and 100.0 must not compare equal by accident
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	delete(m, "sync")
	return m
}

// checkExampleRules checks that the example rule set says what the manifests' comments
// and deploy/README.md say it does.
func checkExampleRules(t *testing.T, c *rule.Config) {
	t.Helper()
	win := func(limit int64, window time.Duration) algo.Params {
		return algo.Params{Limit: limit, WindowUs: window.Microseconds()}
	}
	type want struct {
		id      string
		algo    algo.Kind
		windows []algo.Params // Kind is filled in from algo
		burst   int64
		cost    int64
		fail    rule.FailMode
		shadow  bool
		strict  bool
	}
	for _, w := range []want{
		{id: "plan", algo: algo.TokenBucket, windows: []algo.Params{win(100, time.Minute)}, cost: 1},
		{id: "search", algo: algo.TokenBucket, windows: []algo.Params{win(30, time.Minute)}, cost: 1},
		{id: "users", algo: algo.GCRA, windows: []algo.Params{win(100, time.Minute)}, burst: 120, cost: 1},
		{id: "embed", algo: algo.TokenBucket, windows: []algo.Params{win(1000, time.Minute)}, cost: 10},
		{id: "v2-burst", algo: algo.SlidingWindowCounter, windows: []algo.Params{win(100, time.Second), win(3000, time.Minute), win(100000, time.Hour)}, cost: 1},
		{id: "login", algo: algo.SlidingWindowLog, windows: []algo.Params{win(5, time.Minute)}, cost: 1, fail: rule.FailClosed, strict: true},
		{id: "exports", algo: algo.FixedWindow, windows: []algo.Params{win(10, time.Hour)}, cost: 1, shadow: true},
	} {
		t.Run(w.id, func(t *testing.T) {
			r := c.RuleByID(w.id)
			if r == nil {
				t.Fatalf("no rule %q", w.id)
			}
			for i := range w.windows {
				w.windows[i].Kind = w.algo
			}
			if w.burst != 0 {
				w.windows[0].Burst = w.burst
			}
			if r.Algo != w.algo || !reflect.DeepEqual(r.Windows, w.windows) {
				t.Errorf("algorithm %v windows %+v, want %v %+v", r.Algo, r.Windows, w.algo, w.windows)
			}
			if r.Cost != w.cost || r.Fail != w.fail || r.Shadow != w.shadow || r.Strict != w.strict {
				t.Errorf("cost %d fail %v shadow %v strict %v, want %d %v %v %v", r.Cost, r.Fail, r.Shadow, r.Strict, w.cost, w.fail, w.shadow, w.strict)
			}
		})
	}
	plan := c.RuleByID("plan")
	if plan == nil {
		return
	}
	for tier, limit := range map[string]int64{"free": 100, "pro": 1000, "enterprise": 10000} {
		if ws := plan.Tiers[tier]; len(ws) != 1 || ws[0].Limit != limit || ws[0].WindowUs != time.Minute.Microseconds() {
			t.Errorf("tier %s: windows %+v, want %d per minute", tier, ws, limit)
		}
	}
	if len(plan.Overrides) != 1 || plan.Overrides[0].Windows[0].Limit != 50000 {
		t.Errorf("plan overrides = %+v, want one of 50000 per minute", plan.Overrides)
	}
	if v := c.CheckLists("sk_internal_ci", ""); v.Action != rule.ListAllow {
		t.Errorf("sk_internal_ci: list verdict %v, want allow", v.Action)
	}
	if v := c.CheckLists("sk_revoked_old", ""); v.Action != rule.ListDeny {
		t.Errorf("sk_revoked_old: list verdict %v, want deny", v.Action)
	}
}

// TestExampleRequests runs a few requests through the example rule set: which rules
// apply and with which limits.
func TestExampleRequests(t *testing.T) {
	e, err := CheckEnvoy(readFile(t, envoyFile))
	if err != nil {
		t.Fatal(err)
	}
	type applied struct {
		id    string
		limit int64 // of the first window
		cost  int64
	}
	for _, tc := range []struct {
		name, method, path, apiKey string
		want                       []applied
	}{
		{"free search", "GET", "/search", "sk_free_1", []applied{{"plan", 100, 1}, {"search", 30, 1}}},
		{"pro users", "GET", "/users/7", "sk_pro_1", []applied{{"plan", 1000, 1}, {"users", 100, 1}}},
		{"enterprise", "GET", "/", "sk_ent_1", []applied{{"plan", 10000, 1}}},
		{"override beats tier", "GET", "/", "sk_ent_acme_1", []applied{{"plan", 50000, 1}}},
		{"embed costs 10", "POST", "/embed", "sk_free_1", []applied{{"plan", 100, 1}, {"embed", 1000, 10}}},
		{"embed GET is not costed", "GET", "/embed", "sk_free_1", []applied{{"plan", 100, 1}}},
		{"login by address", "POST", "/login", "", []applied{{"plan", 100, 1}, {"login", 5, 1}}},
		{"searching is not search", "GET", "/searching", "sk_free_1", []applied{{"plan", 100, 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := &rule.Request{
				Method: tc.method, Host: "api.example.com", Path: tc.path, PeerAddr: "192.0.2.10:5555",
				Header: func(name string) (string, bool) {
					if name == "x-api-key" && tc.apiKey != "" {
						return tc.apiKey, true
					}
					return "", false
				},
			}
			var got []applied
			for _, a := range e.Rules.Apply(req, nil) {
				got = append(got, applied{a.Rule.ID, a.Windows[0].Limit, a.Cost})
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("applied %+v, want %+v", got, tc.want)
			}
		})
	}
}

// mutate returns data with old replaced by new, failing the test unless old occurs
// exactly once: a mutation that silently stops applying would leave a negative test that
// passes for the wrong reason.
func mutate(t *testing.T, data []byte, old, new string) []byte {
	t.Helper()
	if n := bytes.Count(data, []byte(old)); n != 1 {
		t.Fatalf("mutation target %q occurs %d times, want 1", old, n)
	}
	return bytes.Replace(data, []byte(old), []byte(new), 1)
}

// The negative cases mutate the real files rather than keep copies in testdata: a copy
// would go stale and then fail for some other reason than the one it is named after.
// Each case asserts the error names what was broken.
func TestEnvoyRejects(t *testing.T) {
	good := readFile(t, envoyFile)
	router := "          - name: envoy.filters.http.router\n" +
		"            typed_config:\n" +
		"              \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router\n"
	for _, tc := range []struct {
		name, old, new, wantErr string
	}{
		{"unknown_bootstrap_field", "static_resources:\n", "static_resources:\n  listenerz: []\n", `unknown field "listenerz"`},
		{"unknown_field_in_typed_config", "vm_id: tollgate", "vm_idd: tollgate", `unknown field "vm_idd"`},
		{"unknown_type_url", "envoy.extensions.filters.http.router.v3.Router", "envoy.extensions.filters.http.routr.v3.Router", "routr"},
		{"duplicate_key", "stat_prefix: ingress_http\n", "stat_prefix: ingress_http\n          stat_prefix: again\n", "stat_prefix"},
		{"validation_rule_port", "port_value: 10000}", "port_value: 70000}", "PortValue"},
		{"validation_rule_in_typed_config", "stat_prefix: ingress_http", "stat_prefix: \"\"", "StatPrefix"},
		{"bad_plugin_config", `"limit": 30, "window": "1m"`, `"limit": -30, "window": "1m"`, "rules[1].limit"},
		{"unknown_plugin_config_field", `"retry_jitter_ms": 1000,`, `"retry_jiter_ms": 1000,`, "retry_jiter_ms: unknown field"},
		{"sync_cluster_undefined", `"cluster": "tollgate_ratelimit"`, `"cluster": "tollgate_ratelimt"`, "not a cluster of static_resources"},
		{"empty_vm_id", "vm_id: tollgate", `vm_id: ""`, "vm_id is empty"},
		{"no_router_after_filter", router, "", "must come before envoy.filters.http.router"},
		{"route_to_undefined_cluster", "route: {cluster: backend}", "route: {cluster: backnd}", `undefined cluster "backnd"`},
		{"no_tollgate_filter", "root_id: tollgate", "root_id: other", "exactly one envoy.filters.http.wasm filter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := CheckEnvoy(mutate(t, good, tc.old, tc.new))
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %q does not mention %q", err, tc.wantErr)
			}
			t.Logf("rejected: %v", err)
		})
	}
}

func TestIstioRejects(t *testing.T) {
	good := readFile(t, pluginFile)
	for _, tc := range []struct {
		name, old, new, wantErr string
	}{
		{"unknown_spec_field", "failStrategy: FAIL_OPEN", "failStratgy: FAIL_OPEN", "spec.failStratgy: unknown field"},
		{"proto_field_name", "pluginConfig:", "plugin_config:", `write "pluginConfig"`},
		{"unknown_nested_field", "consecutiveLocalOriginFailures: 3", "consecutiveLocalOriginFailure: 3", "consecutiveLocalOriginFailure: unknown field"},
		{"bad_enum", "phase: AUTHZ", "phase: AUTHORIZATION", "AUTHORIZATION"},
		{"bad_duration", "connectTimeout: 250ms", "connectTimeout: 250 ms", "invalid duration"},
		{"unknown_kind", "kind: DestinationRule", "kind: DestinationRules", "unsupported apiVersion/kind"},
		{"envelope_unknown_field", "  name: tollgate\n", "  name: tollgate\n  nmespace: x\n", `unknown field "nmespace"`},
		{"bad_name", "  name: tollgate\n", "  name: Tollgate\n", "not a DNS-1123 name"},
		{"bad_plugin_config", "      limit: 30\n", "      limit: thirty\n", "rules[1].limit"},
		{"fractional_window", "window: 1h}", "window: 1.5}", "rules[4].windows[2].window"},
		{"short_sync_cluster", `cluster: "` + istioSyncCluster + `"`, `cluster: "tollgate_ratelimit"`, "is not a cluster Istio generates"},
		{"short_host_in_cluster", `cluster: "` + istioSyncCluster + `"`, `cluster: "outbound|8081||tollgate-ratelimit"`, "FQDN"},
		{"undefined_subset", `cluster: "` + istioSyncCluster + `"`, `cluster: "outbound|8081|v1|tollgate-ratelimit.tollgate.svc.cluster.local"`, `defines subset "v1"`},
		{"no_url", "  url: oci://registry.example.com/tollgate/filter:v0.1.0\n", "", "spec.url is required"},
		{"bad_url_scheme", "url: oci://", "url: ftp://", "scheme must be"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := CheckIstio(mutate(t, good, tc.old, tc.new))
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %q does not mention %q", err, tc.wantErr)
			}
			t.Logf("rejected: %v", err)
		})
	}
}

func TestIstioRejectsSecondPlugin(t *testing.T) {
	good := readFile(t, pluginFile)
	end := bytes.Index(good, []byte("\n---\n"))
	if end < 0 {
		t.Fatal("plugin.yaml has no second document")
	}
	twice := append(append(append([]byte{}, good[:end]...), "\n---\n"...), good...)
	if _, err := CheckIstio(twice); err == nil || !strings.Contains(err.Error(), "a second WasmPlugin") {
		t.Fatalf("got %v, want a second-WasmPlugin error", err)
	}
}

func TestSplitDocuments(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"one", "a: 1\n", []string{"a: 1\n"}},
		{"two", "a: 1\n---\nb: 2\n", []string{"a: 1\n", "b: 2\n"}},
		{"leading_marker", "---\na: 1\n", []string{"", "a: 1\n"}},
		{"marker_with_comment", "a: 1\n--- # next\nb: 2", []string{"a: 1\n", "b: 2"}},
		{"marker_with_spaces", "a: 1\n---  \r\nb: 2\n", []string{"a: 1\n", "b: 2\n"}},
		{"not_a_marker", "a: |\n  ----\n----\n", []string{"a: |\n  ----\n----\n"}},
		{"dashes_in_value", "a: ---x\n", []string{"a: ---x\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, d := range splitDocuments([]byte(tc.in)) {
				got = append(got, string(d))
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// The fuzz targets check that the checkers never panic on arbitrary manifests and that
// an accepted manifest always comes with its parsed rules. Their seeds (the real files)
// run in plain go test.
func FuzzCheckEnvoy(f *testing.F) {
	f.Add(readFile(f, envoyFile))
	f.Add([]byte("static_resources: {}\n"))
	f.Add([]byte("{\"admin\": 1}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := CheckEnvoy(data)
		if err == nil && (e == nil || e.Rules == nil || e.Filter == nil) {
			t.Fatal("accepted without a filter and rules")
		}
	})
}

func FuzzCheckIstio(f *testing.F) {
	f.Add(readFile(f, pluginFile))
	f.Add([]byte("---\n---\n"))
	f.Add([]byte("apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: x}\nspec: {host: a.b}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		is, err := CheckIstio(data)
		if err == nil && (is == nil || is.Plugin == nil || is.Rules == nil) {
			t.Fatal("accepted without a plugin and rules")
		}
	})
}

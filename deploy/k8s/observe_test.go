package k8s

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	promql "github.com/prometheus/prometheus/promql/parser"

	"github.com/tollgate-rl/tollgate/filter/plugin"
	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/rlqs"
	"github.com/tollgate-rl/tollgate/ratelimit/rls"
	"github.com/tollgate-rl/tollgate/ratelimit/service"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

const (
	dashboardFile  = "../grafana/tollgate.json"
	alertsFile     = "../prometheus/alerts.yaml"
	filterMetrics  = "../../filter/plugin/metrics.go"
	filterPrefix   = "tollgate."
	promBuiltinsUp = "up" // written by Prometheus for every scrape target
)

// TestDashboardAndAlerts: the shipped dashboard and alert rules parse (the alerts with
// Prometheus's own rule-file parser), and every metric their queries use is one the
// filter or the service exports. A copy with one metric renamed fails, so renaming a
// metric without updating them breaks the build.
func TestDashboardAndAlerts(t *testing.T) {
	known := exportedMetrics(t)
	dash, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	alerts, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		dash        []byte
		alerts      []byte
		wantUnknown []string
		wantErr     string
	}{
		{"shipped", dash, alerts, nil, ""},
		{"dashboard metric renamed", rename(t, dash, "tollgate_rule_refused_requests_total", "tollgate_rule_refusals_total"), alerts,
			[]string{"tollgate_rule_refusals_total"}, ""},
		{"dashboard per-rule series renamed", rename(t, dash, "tollgate_rule_limited[", "tollgate_rule_rejected["), alerts,
			[]string{"tollgate_rule_rejected"}, ""},
		{"alert histogram renamed", dash, rename(t, alerts, "tollgate_sync_rtt_ms_bucket", "tollgate_sync_rtt_bucket"),
			[]string{"tollgate_sync_rtt_bucket"}, ""},
		{"alert metric renamed", dash, rename(t, alerts, "tollgate_answers_degraded", "tollgate_degraded_answers"),
			[]string{"tollgate_degraded_answers"}, ""},
		{"alert on the gRPC services' metrics", dash, rename(t, alerts, "tollgate_sync_batches_total", "tollgate_rls_requests_total"), nil, ""},
		{"alert not PromQL", dash, rename(t, alerts, "sum(rate(tollgate_bucket_evictions[5m])) > 0", "sum(rate(tollgate_bucket_evictions[5m]) > 0"),
			nil, "TollgateBucketTableFull"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			used, err := usedMetrics(tt.dash, tt.alerts)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one naming %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var unknown []string
			for _, n := range used {
				if !known[n] {
					unknown = append(unknown, n)
				}
			}
			if !slices.Equal(unknown, tt.wantUnknown) {
				t.Fatalf("metrics used but not exported: %q, want %q", unknown, tt.wantUnknown)
			}
			if tt.name == "shipped" && len(used) < 15 {
				t.Fatalf("only %d metric names found in the queries: %q", len(used), used)
			}
		})
	}
}

// rename replaces old by new in a copy of b, failing when old is not there (the test
// would then prove nothing).
func rename(t *testing.T, b []byte, old, new string) []byte {
	t.Helper()
	if !strings.Contains(string(b), old) {
		t.Fatalf("%q is not in the file", old)
	}
	return []byte(strings.ReplaceAll(string(b), old, new))
}

// usedMetrics parses the dashboard (JSON, every panel target's expr) and the alerts
// (rulefmt, which also checks each expression, "for" and template) and returns the
// metric names their queries select, sorted.
func usedMetrics(dash, alerts []byte) ([]string, error) {
	p := promql.NewParser(promql.Options{})
	var exprs []string
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(dash, &d); err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	for _, pn := range d.Panels {
		for _, tg := range pn.Targets {
			// Grafana's variables are not PromQL: a duration stands in for them.
			exprs = append(exprs, strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h").Replace(tg.Expr))
		}
	}
	groups, errs := rulefmt.Parse(alerts, false, model.UTF8Validation, p, slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		return nil, fmt.Errorf("alerts: %w", errors.Join(errs...))
	}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	seen := map[string]bool{}
	for _, e := range exprs {
		ast, err := p.ParseExpr(e)
		if err != nil {
			return nil, fmt.Errorf("query %q: %w", e, err)
		}
		promql.Inspect(ast, func(n promql.Node, _ []promql.Node) error {
			if vs, ok := n.(*promql.VectorSelector); ok && vs.Name != "" {
				seen[vs.Name] = true
			}
			return nil
		})
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// exportedMetrics is every metric name the filter or the service exports, plus "up".
func exportedMetrics(t *testing.T) map[string]bool {
	known := map[string]bool{promBuiltinsUp: true}
	for _, n := range filterMetricNames(t) {
		known[n] = true
	}
	for _, n := range serviceMetricNames(t) {
		known[n] = true
	}
	return known
}

// filterMetricNames reads the filter's metric definitions (every def(kind, "name") or
// def(kind, constant) in filter/plugin/metrics.go) as Envoy's Prometheus endpoint
// names them: the stat name
// with every character outside [a-zA-Z0-9_:] turned into '_' (tollgate.requests_allowed
// → tollgate_requests_allowed); a histogram adds its _bucket, _sum and _count series.
// The per-rule stats (plugin.RuleStats) are named as envoy.yaml's stats tag leaves them:
// the rule cut out into a label (tollgate_rule_limited{rule="api"}).
func filterMetricNames(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filterMetrics, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A name is a string literal or a string constant of the file (the stats the filter
	// sets at once are named by constants it also lists in RecordedMetrics).
	consts := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != len(vs.Values) {
			return true
		}
		for i, id := range vs.Names {
			if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if v, err := strconv.Unquote(lit.Value); err == nil {
					consts[id.Name] = v
				}
			}
		}
		return true
	})
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) != 2 {
			return true
		}
		if id, ok := call.Fun.(*ast.Ident); !ok || id.Name != "def" {
			return true
		}
		var name string
		switch a := call.Args[1].(type) {
		case *ast.BasicLit:
			if a.Kind != token.STRING {
				return true
			}
			v, err := strconv.Unquote(a.Value)
			if err != nil {
				t.Fatal(err)
			}
			name = v
		case *ast.Ident:
			v, ok := consts[a.Name]
			if !ok {
				t.Fatalf("def(_, %s) in %s: not a string constant of the file", a.Name, filterMetrics)
			}
			name = v
		default:
			return true
		}
		prom := envoyPrometheusName(filterPrefix + name)
		out = append(out, prom)
		if kind, ok := call.Args[0].(*ast.Ident); ok && kind.Name == "Histogram" {
			out = append(out, prom+"_bucket", prom+"_sum", prom+"_count")
		}
		return true
	})
	tag := regexp.MustCompile(plugin.RuleStatsTagRegex)
	for _, stat := range plugin.RuleStats {
		name := plugin.RuleStatName("api", stat)
		m := tag.FindStringSubmatchIndex(name)
		if m == nil || name[m[4]:m[5]] != "api" {
			t.Fatalf("the rule tag does not extract the rule from %q", name)
		}
		out = append(out, envoyPrometheusName(name[:m[2]]+name[m[3]:]))
	}
	if len(out) < 10 {
		t.Fatalf("found %d metric definitions in %s: has the filter changed how it defines them?", len(out), filterMetrics)
	}
	return out
}

var nonProm = regexp.MustCompile(`[^a-zA-Z0-9_:]`)

func envoyPrometheusName(stat string) string { return nonProm.ReplaceAllString(stat, "_") }

// serviceMetricNames runs a sync service on a real Redis, with its gRPC rate limit
// services, sends it a batch (so the per-rule and per-endpoint series exist) and reads
// its /metrics; histograms add their
// _bucket, _sum and _count series. Series the batch did not create (an error kind that
// did not happen) come from the registry's descriptions of what it exports.
func serviceMetricNames(t *testing.T) []string {
	t.Helper()
	srv := redistest.StartStandalone(t)
	store.RouteRedisLogs(slog.New(slog.DiscardHandler))
	m := service.NewMetrics()
	st, err := store.Open(store.Config{Mode: store.Standalone, Addrs: srv.Addrs(), Lease: lease.DefaultSyncConfig}, m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	svc := service.New(service.Config{SyncSecret: "s", AdminToken: "a", Logger: slog.New(slog.DiscardHandler)}, st, m)
	// The gRPC rate limit services register their metrics on the same registry when
	// --rls-listen starts them.
	rls.New(svc, slog.New(slog.DiscardHandler), rls.LeaseOptions{Off: true})
	t.Cleanup(rlqs.New(svc, slog.New(slog.DiscardHandler), rlqs.Options{}).Close)
	hs := httptest.NewServer(svc.Handler())
	t.Cleanup(hs.Close)
	body, err := wire.AppendBatch(nil, &wire.Batch{Node: "gw", Seq: 1, Deltas: []wire.Delta{
		{Key: "k", Rule: "api", Algo: uint8(algo.TokenBucket), Limit: 10, WindowMs: 1000, Over: 20, Rejected: 3},
	}})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, hs.URL+"/v1/sync", strings.NewReader(string(body)))
	req.Header.Set("Authorization", "Bearer s")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/sync: %v %v", resp, err)
	}
	resp.Body.Close()
	resp, err = http.Get(hs.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	tp := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := tp.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for name, f := range fams {
		out = append(out, name)
		if f.GetType().String() == "HISTOGRAM" || f.GetType().String() == "SUMMARY" {
			out = append(out, name+"_bucket", name+"_sum", name+"_count")
		}
	}
	if _, ok := fams["tollgate_rule_refused_requests_total"]; !ok {
		t.Fatalf("/metrics after a batch with refusals lacks tollgate_rule_refused_requests_total")
	}
	descs := make(chan *prometheus.Desc)
	go func() { m.Registry.Describe(descs); close(descs) }()
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range descs {
		if s := fq.FindStringSubmatch(d.String()); s != nil {
			out = append(out, s[1])
		}
	}
	return out
}

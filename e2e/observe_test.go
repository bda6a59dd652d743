package e2e

import (
	"bytes"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
	"github.com/tollgate-rl/tollgate/shared/keyhash"
)

// TestOperatorSeesWhyARequestWasLimited drives one caller key over a rule's limit
// through the tollgate-gateway executable and reads what an operator would: the
// gateway's Prometheus endpoint (the per-rule series, one per rule with a rule label,
// counting exactly what was allowed and limited), the service's per-rule counter, its
// /v1/top and the tollgate CLI's top (the refused key's hash first), and the gateway's
// access log (the refused request's line names the rule, the decision and the key's
// hash, never the key).
func TestOperatorSeesWhyARequestWasLimited(t *testing.T) {
	t.Parallel()
	e := sharedEnv(t)
	svc, err := harness.StartService(e.serviceConfig(append([]string{"--top-flush", "200ms"}, sharedServiceArgs...)...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Stop)
	dir := t.TempDir()
	gwBin, err := harness.BuildCommand(dir, "./e2e/cmd/tollgate-gateway")
	if err != nil {
		t.Fatal(err)
	}
	cliBin, err := harness.BuildCommand(dir, "./ratelimit/cmd/tollgate")
	if err != nil {
		t.Fatal(err)
	}

	const limit, abuserRequests, lightRequests = 5, 8, 2
	ruleID := uniqueKey("observe")
	abuser, light := uniqueKey("sk_abuser"), uniqueKey("sk_light")
	pc, err := harness.GatewayConfig{
		NodeID:   uniqueKey("gw-observe"),
		Rules:    []byte(`{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"` + ruleID + `","limit":` + strconv.Itoa(limit) + `,"window":"1m"}]}`),
		Pin:      pinned,
		Services: []string{svc.Addr()},
		Secret:   syncSecret,
	}.PluginConfig()
	if err != nil {
		t.Fatal(err)
	}
	wasm, config, accessLog := filepath.Join(dir, "filter.wasm"), filepath.Join(dir, "plugin.json"), filepath.Join(dir, "access.log")
	for name, b := range map[string][]byte{wasm: e.bins.Wasm, config: pc} {
		if err := os.WriteFile(name, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	gw, err := harness.StartGatewayProcess(gwBin, "--wasm", wasm, "--config", config, "--workers", "1",
		"--cluster", harness.SyncCluster+"="+svc.Addr(), "--access-log", accessLog)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Stop)

	send := func(key string) int {
		req, _ := http.NewRequest(http.MethodGet, gw.URL+"/v1/orders", nil)
		req.Header.Set("x-api-key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	var allowed, limited int
	for i := range abuserRequests + lightRequests {
		key := abuser
		if i >= abuserRequests {
			key = light
		}
		switch st := send(key); st {
		case http.StatusOK:
			allowed++
		case http.StatusTooManyRequests:
			limited++
		default:
			t.Fatalf("request %d answered %d", i, st)
		}
	}
	wantAllowed, wantLimited := limit+lightRequests, abuserRequests-limit
	if allowed != wantAllowed || limited != wantLimited {
		t.Fatalf("answers: %d allowed, %d limited; want %d and %d", allowed, limited, wantAllowed, wantLimited)
	}
	hash := keyhash.String(abuser)

	t.Run("gateway per-rule series", func(t *testing.T) {
		// Read once the first sync's round trip is recorded (the counters are final).
		var fams map[string]*dto.MetricFamily
		err := harness.Poll(5*time.Second, 50*time.Millisecond, func() (bool, error) {
			resp, err := http.Get(gw.AdminURL + "/metrics")
			if err != nil {
				return false, err
			}
			defer resp.Body.Close()
			tp := expfmt.NewTextParser(model.UTF8Validation)
			if fams, err = tp.TextToMetricFamilies(resp.Body); err != nil {
				return false, err
			}
			f := fams["tollgate_sync_rtt_ms"]
			return f != nil && len(f.GetMetric()) > 0 && f.GetMetric()[0].GetHistogram().GetSampleCount() > 0, nil
		})
		if err != nil {
			t.Fatalf("no sync round trip in the gateway's histogram: %v", err)
		}
		for name, want := range map[string]int{"tollgate_rule_allowed": wantAllowed, "tollgate_rule_limited": wantLimited, "tollgate_rule_degraded": 0} {
			f := fams[name]
			if f == nil || f.GetType().String() != "COUNTER" {
				t.Fatalf("%s: %v, want a counter family", name, f)
			}
			var got float64
			found := false
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "rule" && l.GetValue() == ruleID {
						got, found = m.GetCounter().GetValue(), true
					}
				}
			}
			if !found || got != float64(want) {
				t.Errorf("%s{rule=%q} = %v (found %v), want %d", name, ruleID, got, found, want)
			}
		}
		if f := fams["tollgate_bucket_table_slots_used"]; f == nil || f.GetType().String() != "GAUGE" || f.GetMetric()[0].GetGauge().GetValue() != 2 {
			t.Errorf("tollgate_bucket_table_slots_used: %v, want a gauge of 2 (two callers)", f)
		}
		if f := fams["tollgate_sync_rtt_ms"]; f.GetType().String() != "HISTOGRAM" {
			t.Errorf("tollgate_sync_rtt_ms is a %s, want a histogram", f.GetType())
		}
	})

	t.Run("service counter and top", func(t *testing.T) {
		admin := harness.Admin{Base: svc.URL(), Token: adminToken}
		var cli string
		err := harness.Poll(20*time.Second, 100*time.Millisecond, func() (bool, error) {
			refused, err := svc.Metric(`tollgate_rule_refused_requests_total{rule="` + ruleID + `"}`)
			if err != nil || refused != float64(wantLimited) {
				return false, err
			}
			top, err := admin.Top(ruleID)
			if err != nil || len(top.Keys) == 0 || top.Keys[0].Key != hash || top.Keys[0].Count != uint64(wantLimited) {
				return false, err
			}
			cmd := exec.Command(cliBin, "--server", svc.URL(), "top", ruleID)
			cmd.Env = append(os.Environ(), "TOLLGATE_ADMIN_TOKEN="+adminToken)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("tollgate top: %v\n%s", err, out)
			}
			cli = string(out)
			return true, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`(?m)^1\s+` + strconv.Itoa(wantLimited) + `\s+` + hash + `$`).MatchString(cli) {
			t.Errorf("tollgate top does not rank %s first with %d refusals:\n%s", hash, wantLimited, cli)
		}
	})

	t.Run("access log", func(t *testing.T) {
		want := `429 tollgate_rate_limited "127.0.0.1:`
		meta := `tollgate="rule=` + ruleID + ` decision=limited remaining=0 limit=` + strconv.Itoa(limit) + ` degraded=false key=` + hash + `"`
		var lines []string
		err := harness.Poll(5*time.Second, 50*time.Millisecond, func() (bool, error) {
			b, err := os.ReadFile(accessLog)
			if err != nil {
				return false, nil
			}
			lines = strings.Split(strings.TrimSpace(string(b)), "\n")
			return len(lines) == abuserRequests+lightRequests, nil
		})
		if err != nil {
			t.Fatalf("access log has %d lines, want %d: %v", len(lines), abuserRequests+lightRequests, err)
		}
		last := lines[abuserRequests-1] // the abuser's last request, refused
		if !strings.Contains(last, want) || !strings.Contains(last, meta) {
			t.Errorf("refused request's line\n%s\nlacks %q and %q", last, want, meta)
		}
		if all := strings.Join(lines, "\n"); strings.Contains(all, abuser) || strings.Contains(all, light) {
			t.Errorf("the access log shows a raw caller key:\n%s", all)
		}
		if !bytes.Contains([]byte(lines[0]), []byte("decision=allowed remaining=4 limit=5")) {
			t.Errorf("first line %q does not show an allowed decision with 4 left", lines[0])
		}
	})
}

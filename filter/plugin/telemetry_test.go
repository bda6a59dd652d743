package plugin_test

import (
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/nativehost"
	"github.com/tollgate-rl/tollgate/filter/plugin"
	"github.com/tollgate-rl/tollgate/shared/keyhash"
)

func ruleStat(id, stat string) string { return "rule=.=" + id + ";.;tollgate.rule." + stat }

// TestTelemetry: per-rule stats count each decision against its rule, and every
// decision sets its metadata (rule, decision, remaining, limit, degraded, key hash) as the
// stream's "tollgate" property; the telemetry switches turn each off.
func TestTelemetry(t *testing.T) {
	const api = `{"id":"api","limit":3,"window":"1m"}`
	const shadow = `{"id":"canary","limit":1,"window":"1m","shadow":true}`
	tests := []struct {
		name      string
		config    string
		requests  int
		key       string
		wantStats map[string]int64
		wantLast  string // the last request's metadata ("" none)
	}{
		{"one key over the limit", `{"rules":[` + api + `]}`, 5, "sk_abuser",
			map[string]int64{ruleStat("api", "allowed"): 3, ruleStat("api", "limited"): 2, ruleStat("api", "shadow_limited"): 0},
			"rule=api decision=limited remaining=0 limit=3 degraded=false key=" + keyhash.String("sk_abuser")},
		{"last admitted request", `{"rules":[` + api + `]}`, 2, "sk_ok",
			map[string]int64{ruleStat("api", "allowed"): 2, ruleStat("api", "limited"): 0},
			"rule=api decision=allowed remaining=1 limit=3 degraded=false key=" + keyhash.String("sk_ok")},
		{"shadow rule", `{"rules":[` + api + `,` + shadow + `]}`, 2, "sk_new",
			map[string]int64{ruleStat("api", "allowed"): 2, ruleStat("canary", "allowed"): 2, ruleStat("canary", "shadow_limited"): 1},
			"rule=canary decision=shadow_limited remaining=0 limit=1 degraded=false key=" + keyhash.String("sk_new")},
		// Under enforcement shadow no bucket enforces, so none is named with a remaining
		// and limit, as none is in the rate-limit headers.
		{"enforcement shadow", `{"enforcement":"shadow","rules":[` + api + `]}`, 1, "sk_s",
			map[string]int64{ruleStat("api", "allowed"): 1},
			"rule=api decision=allowed degraded=false key=" + keyhash.String("sk_s")},
		{"deny list", `{"deny":["sk_revoked_*"],"rules":[` + api + `]}`, 1, "sk_revoked_1",
			map[string]int64{ruleStat("api", "allowed"): 0, "tollgate.requests_denied_by_list": 1},
			"rule=- decision=denied degraded=false"},
		// With the service's key-hash secret the access log names a key as the service's
		// logs, Redis and /v1/top do (service.HashKey, checked equal to AppendKeyed there).
		{"keyed name", `{"telemetry":{"key_hash_secret":"kh-s3cret"},"rules":[` + api + `]}`, 1, "sk_keyed",
			map[string]int64{ruleStat("api", "allowed"): 1},
			"rule=api decision=allowed remaining=2 limit=3 degraded=false key=" + string(keyhash.AppendKeyed(nil, "kh-s3cret", "sk_keyed"))},
		{"telemetry off", `{"telemetry":{"rule_stats":false,"decision_metadata":false},"rules":[` + api + `]}`, 5, "sk_abuser",
			map[string]int64{"tollgate.requests_allowed": 3, "tollgate.requests_rejected": 2}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newGateway(t, tt.config)
			var last string
			for range tt.requests {
				s := g.send("/v1/search", "x-api-key: "+tt.key)
				last = s.FilterState["tollgate"]
			}
			for name, want := range tt.wantStats {
				if got := g.h.Metric(name); got != want {
					t.Errorf("%s = %d, want %d", name, got, want)
				}
			}
			if last != tt.wantLast {
				t.Errorf("metadata %q, want %q", last, tt.wantLast)
			}
			if tt.wantLast == "" {
				for name := range g.h.Metrics() {
					if strings.HasPrefix(name, "rule=") {
						t.Errorf("per-rule stat %q defined with rule_stats off", name)
					}
				}
			}
		})
	}
}

// TestTelemetryDegraded: with the service down, decisions count as degraded per rule, the
// metadata says so (a fail-closed rule's 503 as unavailable), and the worker logs the
// breaker's opening once.
func TestTelemetryDegraded(t *testing.T) {
	g := &gateway{t: t, now: t0, down: true}
	var logs []string
	h, err := nativehost.New(nativehost.Config{PluginConfig: []byte(cfgSync), Clock: func() int64 { return g.now }, Seed: 1,
		Log: func(_ plugin.LogLevel, msg string) { logs = append(logs, msg) }})
	if err != nil {
		t.Fatal(err)
	}
	g.h = h
	for range 5 {
		g.tick(100)
	}
	for _, tt := range []struct{ path, want string }{
		{"/v1/x", "rule=api decision=allowed remaining=2 limit=3 degraded=true key=" + keyhash.String("k1")},
		{"/pay", "rule=closed decision=unavailable degraded=true key=" + keyhash.String("k1")},
	} {
		if got := g.send(tt.path, "x-api-key: k1").FilterState["tollgate"]; got != tt.want {
			t.Errorf("%s: metadata %q, want %q", tt.path, got, tt.want)
		}
	}
	for name, want := range map[string]int64{ruleStat("api", "degraded"): 1, ruleStat("api", "allowed"): 1, ruleStat("closed", "degraded"): 1} {
		if got := h.Metric(name); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
	var opened int
	for _, l := range logs {
		if strings.Contains(l, "sync breaker open") {
			opened++
		}
	}
	if opened != 1 {
		t.Errorf("%d breaker-open lines, want 1: %q", opened, logs)
	}
}

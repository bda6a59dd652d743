package service

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TestTop: deltas reported by a gateway reach the rule's top lists (after a flush) and
// its per-rule Prometheus counters; the refused key is on top of by=refused, the big
// consumer on top of by=consumed, keys are hashes; the endpoint needs the admin token
// and names the bad parameter.
func TestTop(t *testing.T) {
	for _, mode := range []store.Mode{store.Standalone, store.Cluster} {
		t.Run(string(mode), func(t *testing.T) { topList(t, mode) })
	}
}

func topList(t *testing.T, mode store.Mode) {
	o := opts{mode: mode}
	if mode == store.Standalone {
		// A Redis of its own: a rule set other tests push to the shared one would refuse
		// this test's rule.
		o.addrs = redistest.StartStandalone(t).Addrs()
	}
	in := start(t, o)
	rule := uniq("top")
	abuser, quiet, big := uniq("abuser"), uniq("quiet"), uniq("big")
	d := func(key string, over, rejected uint32) wire.Delta {
		x := delta(key, rule, algo.TokenBucket, 100, 60_000)
		x.Over, x.Rejected = over, rejected
		return x
	}
	in.sync(t, "/v1/sync", &wire.Batch{Node: "gw-1", Seq: 1, Deltas: []wire.Delta{d(abuser, 100, 50), d(quiet, 5, 2), d(big, 120, 0)}})
	if err := in.svc.Top().Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	type list struct {
		Rule   string
		By     string
		Hashed bool
		Keys   []struct {
			Key   string
			Count uint64
		}
	}
	for _, tc := range []struct {
		by, wantKey string
		wantCount   uint64
	}{
		{"refused", abuser, 50},
		{"", abuser, 50}, // refused is the default
		{"consumed", big, 120},
	} {
		code, _, out := in.do(t, http.MethodGet, fmt.Sprintf("/v1/top?rule=%s&by=%s&n=2", rule, tc.by), adminToken, nil)
		var l list
		decodeJSON(t, out, &l)
		if code != http.StatusOK || !l.Hashed || len(l.Keys) != 2 || l.Keys[0].Key != KeyHash(tc.wantKey) || l.Keys[0].Count != tc.wantCount {
			t.Fatalf("by=%q: %d %s; want %s (%s) with %d on top", tc.by, code, out, KeyHash(tc.wantKey), tc.wantKey, tc.wantCount)
		}
	}
	for _, tc := range []struct {
		name, path, token string
		code              int
		field             string
	}{
		{"no token", "/v1/top?rule=" + rule, "", http.StatusUnauthorized, ""},
		{"wrong token", "/v1/top?rule=" + rule, "nope", http.StatusUnauthorized, ""},
		{"no rule", "/v1/top", adminToken, http.StatusBadRequest, "rule"},
		{"bad by", "/v1/top?rule=" + rule + "&by=both", adminToken, http.StatusBadRequest, "by"},
		{"n zero", "/v1/top?rule=" + rule + "&n=0", adminToken, http.StatusBadRequest, "n"},
		{"n huge", "/v1/top?rule=" + rule + "&n=100000", adminToken, http.StatusBadRequest, "n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, out := in.do(t, http.MethodGet, tc.path, tc.token, nil)
			var e errorBody
			decodeJSON(t, out, &e)
			if code != tc.code || e.Field != tc.field {
				t.Fatalf("%d %s, want %d naming %q", code, out, tc.code, tc.field)
			}
		})
	}
	over := metricValue(t, in, "tollgate_overshoot_permits_total")
	for _, tc := range []struct {
		name string
		want float64
	}{
		{"tollgate_rule_refused_requests_total", 52},
		{"tollgate_rule_admitted_permits_total", 225},
		{"tollgate_rule_overadmitted_permits_total", over},
	} {
		if got := metricValue(t, in, fmt.Sprintf(`%s{rule="%s"}`, tc.name, rule)); got != tc.want || got == 0 {
			t.Errorf("%s{rule=%q} = %v, want %v (non-zero)", tc.name, rule, got, tc.want)
		}
	}
}

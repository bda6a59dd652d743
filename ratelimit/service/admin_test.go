package service

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/rule"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

const (
	rulesV1   = `{"rules":[{"id":"search","match":{"prefix":"/search"},"limit":30,"window":"1m"}]}`
	rulesYAML = "rules:\n  - id: users\n    match: {prefix: /users}\n    limit: 100\n    window: 1m\n"
	rulesBad  = `{"rules":[{"id":"search","limit":-5,"window":"1m"}]}`
)

func decodeJSON(t testing.TB, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%v in %s", err, b)
	}
}

// parsedRules parses a served rule set and returns its version and rule ids.
func parsedRules(t testing.TB, body []byte) (uint64, []string) {
	t.Helper()
	c, err := rule.Parse(body)
	if err != nil {
		t.Fatalf("served rules do not parse: %v\n%s", err, body)
	}
	var ids []string
	for _, r := range c.Rules {
		ids = append(ids, r.ID)
	}
	return c.Version, ids
}

// TestRulesAPI walks the rules API on its own Redis (rule sets are global) with two
// service instances: auth, put (JSON and YAML), a rejected put that names the field and
// leaves the previous version serving, versions, rollback, lists, and the second
// instance learning each version by itself.
func TestRulesAPI(t *testing.T) {
	srv := redistest.StartStandalone(t)
	a := start(t, opts{addrs: srv.Addrs()})
	b := start(t, opts{addrs: srv.Addrs()})
	eventually(t, 5*time.Second, "instance b subscribed", b.svc.Watcher().Subscribed)

	t.Run("auth", func(t *testing.T) {
		for _, tok := range []string{"", "wrong", syncSecret} {
			if code, _, _ := a.do(t, http.MethodGet, "/v1/rules", tok, nil); code != http.StatusUnauthorized {
				t.Fatalf("GET /v1/rules with token %q: %d, want 401", tok, code)
			}
			if code, _, _ := a.do(t, http.MethodPut, "/v1/rules", tok, []byte(rulesV1)); code != http.StatusUnauthorized {
				t.Fatalf("PUT /v1/rules with token %q: %d, want 401", tok, code)
			}
		}
	})

	// seenBy waits until instance in knows version v (pub/sub or polling) and checks that
	// its sync replies and /v1/sync/rules say so.
	seenBy := func(t *testing.T, in *instance, v uint64) {
		t.Helper()
		eventually(t, 5*time.Second, "version "+strconv.FormatUint(v, 10)+" propagated", func() bool { return in.svc.Watcher().Version() >= v })
		d := wire.Delta{Key: uniq("rv"), Rule: "search", Algo: uint8(algo.TokenBucket), Limit: 10, WindowMs: 1000}
		if r := in.sync(t, "/v1/sync", &wire.Batch{Node: "gw", Seq: 1, Deltas: []wire.Delta{d}}); r.RulesVersion != v {
			t.Fatalf("sync reply carries rules version %d, want %d", r.RulesVersion, v)
		}
		code, hdr, body := in.do(t, http.MethodGet, "/v1/sync/rules", syncSecret, nil)
		if code != http.StatusOK || hdr.Get(RulesVersionHeader) != strconv.FormatUint(v, 10) {
			t.Fatalf("/v1/sync/rules: %d, version header %q, want %d", code, hdr.Get(RulesVersionHeader), v)
		}
		if got, _ := parsedRules(t, body); got != v {
			t.Fatalf("served body has version %d, want %d", got, v)
		}
		if code, _, _ := in.do(t, http.MethodGet, "/v1/sync/rules", syncSecret, nil, "If-None-Match", hdr.Get("ETag")); code != http.StatusNotModified {
			t.Fatalf("conditional GET: %d, want 304", code)
		}
	}

	put := func(t *testing.T, body, contentType string) (int, []byte) {
		t.Helper()
		code, _, out := a.do(t, http.MethodPut, "/v1/rules", adminToken, []byte(body), "Content-Type", contentType, ActorHeader, "alice")
		return code, out
	}

	// current is the version the rules API says is current. Versions are the writer's
	// clock in ms (rulestore.NextVersion): each write's is read back, not predicted.
	current := func(t *testing.T) uint64 {
		t.Helper()
		_, _, out := a.do(t, http.MethodGet, "/v1/rules/versions", adminToken, nil)
		var vs struct{ Current uint64 }
		decodeJSON(t, out, &vs)
		return vs.Current
	}
	var v1, v2 uint64
	t.Run("put json", func(t *testing.T) {
		code, out := put(t, rulesV1, "application/json")
		if code != http.StatusOK {
			t.Fatalf("%d %s", code, out)
		}
		var res struct{ Version uint64 }
		decodeJSON(t, out, &res)
		if v1 = res.Version; v1 == 0 || v1 != current(t) {
			t.Fatalf("first version %d, current %d", res.Version, current(t))
		}
		seenBy(t, b, v1)
	})
	t.Run("put yaml", func(t *testing.T) {
		if code, out := put(t, rulesYAML, "application/yaml"); code != http.StatusOK {
			t.Fatalf("%d %s", code, out)
		}
		if v2 = current(t); v2 <= v1 {
			t.Fatalf("version %d after %d", v2, v1)
		}
		seenBy(t, b, v2)
		_, _, body := a.do(t, http.MethodGet, "/v1/rules", adminToken, nil)
		if _, ids := parsedRules(t, body); len(ids) != 1 || ids[0] != "users" {
			t.Fatalf("rules after YAML put: %v", ids)
		}
	})
	t.Run("invalid put names the field and keeps serving", func(t *testing.T) {
		code, out := put(t, rulesBad, "application/json")
		if code != http.StatusUnprocessableEntity {
			t.Fatalf("%d %s, want 422", code, out)
		}
		var eb struct{ Error, Field string }
		decodeJSON(t, out, &eb)
		if eb.Field != "rules[0].limit" || eb.Error == "" {
			t.Fatalf("error body %+v, want field rules[0].limit", eb)
		}
		code, hdr, body := a.do(t, http.MethodGet, "/v1/rules", adminToken, nil)
		if v, _ := parsedRules(t, body); code != http.StatusOK || v != v2 || hdr.Get(RulesVersionHeader) != strconv.FormatUint(v2, 10) {
			t.Fatalf("after a rejected put: %d, version %d", code, v)
		}
		if code, out := put(t, "rules: [unclosed", "application/yaml"); code != http.StatusUnprocessableEntity {
			t.Fatalf("unparsable YAML: %d %s", code, out)
		}
	})
	t.Run("versions and rollback", func(t *testing.T) {
		_, _, out := a.do(t, http.MethodGet, "/v1/rules/versions", adminToken, nil)
		var vs struct {
			Current  uint64
			Versions []struct {
				Version uint64
				By      string
				Action  string
			}
		}
		decodeJSON(t, out, &vs)
		if vs.Current != v2 || len(vs.Versions) != 2 || vs.Versions[0].Version != v2 || vs.Versions[1].Version != v1 || vs.Versions[0].By != "alice" {
			t.Fatalf("versions: %s", out)
		}
		code, _, out := a.do(t, http.MethodPost, "/v1/rules/rollback/"+strconv.FormatUint(v1, 10), adminToken, nil)
		if code != http.StatusOK {
			t.Fatalf("rollback: %d %s", code, out)
		}
		v3 := current(t)
		if v3 <= v2 {
			t.Fatalf("version %d after a rollback from %d", v3, v2)
		}
		seenBy(t, b, v3)
		_, _, body := b.do(t, http.MethodGet, "/v1/sync/rules", syncSecret, nil)
		if _, ids := parsedRules(t, body); len(ids) != 1 || ids[0] != "search" {
			t.Fatalf("rolled back to v1 but serving rules %v", ids)
		}
		if code, _, _ := a.do(t, http.MethodPost, "/v1/rules/rollback/99", adminToken, nil); code != http.StatusNotFound {
			t.Fatalf("rollback to a missing version: %d, want 404", code)
		}
		if code, _, _ := a.do(t, http.MethodPost, "/v1/rules/rollback/x", adminToken, nil); code != http.StatusBadRequest {
			t.Fatalf("rollback to a non-number: %d, want 400", code)
		}
	})
	t.Run("lists", func(t *testing.T) {
		code, _, out := a.do(t, http.MethodPut, "/v1/lists/deny", adminToken, []byte(`{"entries":["sk_revoked_*","10.9.0.0/16"]}`))
		if code != http.StatusOK {
			t.Fatalf("add: %d %s", code, out)
		}
		seenBy(t, b, current(t))
		_, _, body := b.do(t, http.MethodGet, "/v1/sync/rules", syncSecret, nil)
		c, err := rule.Parse(body)
		if err != nil || len(c.Deny) != 2 || len(c.Rules) != 1 {
			t.Fatalf("served rules after adding deny entries: %v %s", err, body)
		}
		code, _, out = a.do(t, http.MethodPut, "/v1/lists/allow", adminToken, []byte(`["10.0.0.0/33"]`))
		var eb struct{ Field string }
		decodeJSON(t, out, &eb)
		if code != http.StatusUnprocessableEntity || !strings.HasPrefix(eb.Field, "allow[") {
			t.Fatalf("invalid CIDR: %d %s", code, out)
		}
		code, _, out = a.do(t, http.MethodDelete, "/v1/lists/deny", adminToken, []byte(`["sk_revoked_*"]`))
		if code != http.StatusOK {
			t.Fatalf("remove: %d %s", code, out)
		}
		_, _, out = a.do(t, http.MethodGet, "/v1/lists/deny", adminToken, nil)
		var l struct {
			Version uint64
			Entries []string
		}
		decodeJSON(t, out, &l)
		if l.Version != current(t) || len(l.Entries) != 1 || l.Entries[0] != "10.9.0.0/16" {
			t.Fatalf("deny list after removal: %s", out)
		}
		if code, _, _ := a.do(t, http.MethodGet, "/v1/lists/grey", adminToken, nil); code != http.StatusNotFound {
			t.Fatalf("unknown list: %d", code)
		}
		seenBy(t, b, l.Version)
	})
	if !strings.Contains(a.log.String(), `"msg":"audit"`) || !strings.Contains(a.log.String(), `"by":"alice"`) {
		t.Fatalf("no audit log lines:\n%s", a.log.String())
	}
}

// TestUsageAndReset: the usage endpoint shows a key's buckets and what is leased out;
// reset deletes them (and logs who did it).
func TestUsageAndReset(t *testing.T) {
	for _, mode := range []store.Mode{store.Standalone, store.Cluster} {
		t.Run(string(mode), func(t *testing.T) { usageAndReset(t, mode) })
	}
}

func usageAndReset(t *testing.T, mode store.Mode) {
	in := start(t, opts{mode: mode})
	key := uniq("user:42")
	var deltas []wire.Delta
	for _, r := range []string{"search", "users"} {
		d := wire.Delta{Key: key, Rule: r, Algo: uint8(algo.TokenBucket), Limit: 100, WindowMs: 60_000, Over: 10}
		deltas = append(deltas, d)
	}
	deltas[0].Over, deltas[0].Early = 100, 1 // spent, and a retry before its Retry-After
	in.sync(t, "/v1/sync", &wire.Batch{Node: "gw-1", Seq: 1, Deltas: deltas})
	if code, _, _ := in.do(t, http.MethodGet, "/v1/usage/"+key, "", nil); code != http.StatusUnauthorized {
		t.Fatalf("usage without token: %d", code)
	}
	code, _, out := in.do(t, http.MethodGet, "/v1/usage/"+key, adminToken, nil)
	var u struct {
		Buckets []struct {
			Rule        string
			Remaining   int64
			Outstanding int64
		}
		Penalty struct{ Level int64 }
	}
	decodeJSON(t, out, &u)
	if code != http.StatusOK || len(u.Buckets) != 2 || u.Penalty.Level != 1 {
		t.Fatalf("usage: %d %s", code, out)
	}
	for _, bu := range u.Buckets {
		want := map[string]int64{"search": 0, "users": 90}[bu.Rule]
		if bu.Remaining+bu.Outstanding != want {
			t.Fatalf("bucket %+v, want remaining+outstanding %d", bu, want)
		}
	}
	code, _, out = in.do(t, http.MethodPost, "/v1/reset/"+key, adminToken, nil, ActorHeader, "bob")
	if code != http.StatusOK || !strings.Contains(string(out), `"deleted": 3`) {
		t.Fatalf("reset: %d %s", code, out)
	}
	_, _, out = in.do(t, http.MethodGet, "/v1/usage/"+key, adminToken, nil)
	decodeJSON(t, out, &u)
	if len(u.Buckets) != 0 || u.Penalty.Level != 0 {
		t.Fatalf("usage after reset: %s", out)
	}
	logs := in.log.String()
	if !strings.Contains(logs, `"action":"reset"`) || !strings.Contains(logs, `"by":"bob"`) || !strings.Contains(logs, `"key_hash":"`+KeyHash(key)+`"`) {
		t.Fatalf("no audit line for the reset naming the key's hash:\n%s", logs)
	}
	if strings.Contains(logs, key) {
		t.Fatalf("the raw caller key is in the service's log:\n%s", logs)
	}
}

package service

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/internal/pgtest"
	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/rulestore"
	"github.com/tollgate-rl/tollgate/ratelimit/rulestore/postgres"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// withPolicy starts an instance on srv with its own connection to the policy store at url.
func withPolicy(t *testing.T, srv *redistest.Server, url string) *instance {
	t.Helper()
	pol, err := postgres.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pol.Close)
	return start(t, opts{addrs: srv.Addrs(), svc: func(c *Config) { c.Policy, c.PolicyPoll = pol, 200*time.Millisecond }})
}

// rulesVersion is the version GET /v1/rules reports (what the instance enforces).
func (in *instance) rulesVersion(t testing.TB) uint64 {
	t.Helper()
	code, hdr, out := in.do(t, http.MethodGet, "/v1/rules", adminToken, nil)
	if code != http.StatusOK {
		t.Fatalf("GET /v1/rules: %d %s", code, out)
	}
	v, _ := strconv.ParseUint(hdr.Get(RulesVersionHeader), 10, 64)
	return v
}

// TestReplicasAgreeWithoutPolicyStoreAndRedis: two replicas with a policy store enforce
// a rule set; PostgreSQL stops, Redis loses everything, and one replica restarts. The
// running replica writes the rule set it enforces back into Redis, the restarted one
// takes it from there, and both enforce and report the same version: a key the one
// refuses, the other refuses too.
func TestReplicasAgreeWithoutPolicyStoreAndRedis(t *testing.T) {
	pg := pgtest.Start(t)
	srv := redistest.StartStandalone(t)
	a, b := withPolicy(t, srv, pg.URL()), withPolicy(t, srv, pg.URL())
	pushRules(t, a, `{"rules":[{"id":"fleet","limit":10,"window":"1h"}]}`)
	v := a.svc.Watcher().Version()
	eventually(t, 5*time.Second, "replica b on the version", func() bool { return b.svc.Watcher().Version() == v })

	pg.Down()
	ctx := context.Background()
	if err := a.st.Client().FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	b.stop()
	b2 := withPolicy(t, srv, pg.URL())
	eventually(t, 5*time.Second, "restarted replica on the enforced version", func() bool { return b2.svc.Watcher().Version() == v })
	if cur, err := rulestore.NewRedis(a.st.Client()).CurrentVersion(ctx); err != nil || cur != v {
		t.Fatalf("Redis holds version %d (%v), want %d written back", cur, err, v)
	}
	for name, in := range map[string]*instance{"running": a, "restarted": b2} {
		if got := in.rulesVersion(t); got != v {
			t.Errorf("%s replica: GET /v1/rules reports version %d, want %d", name, got, v)
		}
		if code, _, out := in.do(t, http.MethodGet, "/readyz", "", nil); code != http.StatusOK {
			t.Errorf("%s replica not ready: %d %s", name, code, out)
		}
	}
	// The key a spends on is refused by both; the rule set is enforced by b2 too.
	key := uniq("fleet")
	if a.spend(t, "fleet", key) {
		t.Fatal("running replica admits a key past its limit")
	}
	if b2.check(t, "fleet", key) {
		t.Fatal("restarted replica admits the key its peer refuses")
	}
	unknown := delta(uniq("k"), "not-a-rule", algo.TokenBucket, 10, 1000)
	if _, r, _ := b2.post(t, &wire.Batch{Node: uniq("gw"), Seq: 1, Deltas: []wire.Delta{unknown}}); r == nil || r.States[0].Flags&wire.StateRefused == 0 {
		t.Fatalf("restarted replica applies a rule outside the rule set: %+v", r)
	}
}

// TestReplicaWithoutRulesNotReady: with the policy store down and Redis empty, a
// replica that starts alone cannot know the rule set: it is not ready, and answers
// sync and check with 503 so gateways decide by their rules' fail modes, until the
// policy store answers; then it enforces the active version.
func TestReplicaWithoutRulesNotReady(t *testing.T) {
	pg := pgtest.Start(t)
	srv := redistest.StartStandalone(t)
	first := withPolicy(t, srv, pg.URL())
	pushRules(t, first, `{"rules":[{"id":"fleet","limit":10,"window":"1h"}]}`)
	v := first.svc.Watcher().Version()
	first.stop() // before the wipe: a running replica would write its rules back
	pg.Down()
	rc := redis.NewClient(&redis.Options{Addr: srv.Addrs()[0]})
	defer rc.Close()
	if err := rc.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	in := withPolicy(t, srv, pg.URL())
	time.Sleep(3 * RestoreInterval) // several rounds of its loops
	if code, _, out := in.do(t, http.MethodGet, "/readyz", "", nil); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz without rules: %d %s, want 503", code, out)
	}
	batch := encode(&wire.Batch{Node: uniq("gw"), Seq: uint64(time.Now().UnixMicro()), Deltas: []wire.Delta{delta(uniq("k"), "fleet", algo.TokenBucket, 10, 3_600_000)}})
	for _, path := range []string{"/v1/sync", "/v1/check"} {
		code, hdr, out := in.do(t, http.MethodPost, path, syncSecret, batch)
		if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" {
			t.Fatalf("%s without rules: %d %s (Retry-After %q), want 503 with Retry-After", path, code, out, hdr.Get("Retry-After"))
		}
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "rules from the policy store", func() bool { return in.svc.Watcher().Version() == v })
	if code, _, out := in.do(t, http.MethodGet, "/readyz", "", nil); code != http.StatusOK {
		t.Fatalf("/readyz with rules: %d %s", code, out)
	}
}

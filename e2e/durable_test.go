package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
	"github.com/tollgate-rl/tollgate/internal/pgtest"
	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/rulestore"
)

// TestPolicyStoreRestoresRules: a service with --policy-store (a real PostgreSQL) gets
// three rule-set versions from three operators; Redis then loses everything (FLUSHALL).
// Within a second the service has put the active version back into Redis; after the
// service restarts on that Redis, every gateway (the running ones and one that starts
// now, each with the compiled filter) enforces it, and the history lists the three
// versions with author and reason.
func TestPolicyStoreRestoresRules(t *testing.T) {
	t.Parallel()
	e := sharedEnv(t)
	pg := pgtest.Start(t)
	rdb, err := redistest.Launch(redistest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rdb.Stop)
	svc, err := harness.StartService(harness.ServiceConfig{Bin: e.bins.Service, RedisAddrs: rdb.Addrs(),
		AdminToken: adminToken, SyncSecret: syncSecret, Args: append([]string{"--policy-store", pg.URL()}, sharedServiceArgs...)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Stop)
	name := uniqueKey("durable")
	gws := e.fleetOn(t, harness.Wazero, []string{svc.Addr()}, name, 2, `{"rules":[]}`, false, harness.Sync{})

	var versions []uint64
	for i, who := range []string{"alice", "bob", "carol"} {
		admin := harness.Admin{Base: svc.URL(), Token: adminToken, Actor: who, Reason: fmt.Sprintf("rollout step %d", i+1)}
		v, err := admin.PutRules([]byte(fmt.Sprintf(`{"rules":[{"id":"durable","match":{"prefix":"/api"},"limit":%d,"window":"1h"}]}`, 100+i)))
		if err != nil {
			t.Fatal(err)
		}
		versions = append(versions, v)
	}
	active := versions[2]
	onVersion(t, gws, active, "/api/durable")

	rc := redis.NewClient(&redis.Options{Addr: rdb.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	ctx := ctxFor(t, time.Minute)
	if err := rc.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	hd := hostDelay(t)
	flushed := time.Now()
	if err := pollWithin(hd, time.Second, 5*time.Millisecond, func() (bool, error) {
		v, err := rulestore.NewRedis(rc).CurrentVersion(ctx)
		return err == nil && v == active, nil
	}); err != nil {
		t.Fatalf("Redis did not hold version %d again within 1 s of FLUSHALL: %v", active, err)
	}
	t.Logf("version %d back in Redis %v after FLUSHALL", active, time.Since(flushed).Round(time.Millisecond))

	// A new service process knows only what Redis holds; a new gateway only what the
	// service serves.
	if err := svc.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := svc.Restart(); err != nil {
		t.Fatal(err)
	}
	late := e.fleetOn(t, harness.Wazero, []string{svc.Addr()}, name+"-late", 1, `{"rules":[]}`, false, harness.Sync{})
	all := append(gws, late...)
	onVersion(t, all, active, "/api/durable")
	probe := uniqueKey("durable-probe")
	for _, g := range all {
		c := g.WorkerClient(0)
		a := c.Get(ctx, g.URL, "/api/durable", probe)
		c.Close()
		if a.Get("X-RateLimit-Limit") != "102" {
			t.Errorf("%s: X-RateLimit-Limit %q, want 102 (the active version's limit)", g.Name, a.Get("X-RateLimit-Limit"))
		}
	}

	req, _ := http.NewRequest("GET", svc.URL()+"/v1/rules/versions", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var hist struct {
		Current  uint64
		Versions []rulestore.Record
	}
	if err := json.NewDecoder(resp.Body).Decode(&hist); err != nil {
		t.Fatal(err)
	}
	if hist.Current != active || len(hist.Versions) != 3 {
		t.Fatalf("history: current %d, %+v; want %d and three versions", hist.Current, hist.Versions, active)
	}
	for i, r := range hist.Versions {
		want := []string{"carol", "bob", "alice"}[i]
		if r.Version != versions[2-i] || r.By != want || r.Reason != fmt.Sprintf("rollout step %d", 3-i) {
			t.Errorf("history[%d] = %+v, want version %d by %s", i, r, versions[2-i], want)
		}
	}
}

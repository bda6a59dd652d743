package postgres_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/hostdelay"
	"github.com/tollgate-rl/tollgate/internal/pgtest"
	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/rulestore"
	"github.com/tollgate-rl/tollgate/ratelimit/rulestore/postgres"
	"github.com/tollgate-rl/tollgate/ratelimit/service"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/lease"
)

var (
	pg           *pgtest.Server
	redisA, redB *redistest.Server
)

func TestMain(m *testing.M) {
	os.Exit(func() int {
		store.RouteRedisLogs(slog.New(slog.DiscardHandler))
		var err error
		if pg, err = pgtest.Launch(); err != nil {
			fmt.Fprintln(os.Stderr, "policy tests need PostgreSQL:", err)
			return 1
		}
		defer pg.Stop()
		if redisA, err = redistest.Launch(redistest.Options{}); err != nil {
			fmt.Fprintln(os.Stderr, "policy tests need Redis:", err)
			return 1
		}
		defer redisA.Stop()
		if redB, err = redistest.Launch(redistest.Options{}); err != nil {
			fmt.Fprintln(os.Stderr, "policy tests need Redis:", err)
			return 1
		}
		defer redB.Stop()
		return m.Run()
	}())
}

const token = "policy-admin-t0ken"

// fresh empties the policy store and both Redis servers: the tests share them.
func fresh(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	p, err := postgres.Open(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if err := postgres.Truncate(ctx, p); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*redistest.Server{redisA, redB} {
		st := openStore(t, r)
		if err := st.Client().FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

func openStore(t *testing.T, r *redistest.Server) *store.Store {
	t.Helper()
	st, err := store.Open(store.Config{Mode: store.Standalone, Addrs: r.Addrs(), Lease: lease.DefaultSyncConfig}, service.NewMetrics())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// replica is one running service with a policy store, on the given Redis.
type replica struct {
	svc   *service.Service
	st    *store.Store
	admin string
}

func startReplica(t *testing.T, r *redistest.Server, poll time.Duration) *replica {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p, err := postgres.Open(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	st := openStore(t, r)
	svc := service.New(service.Config{SyncSecret: "sync", AdminToken: token, Logger: slog.New(slog.DiscardHandler),
		Policy: p, PolicyPoll: poll}, st, nil)
	done := make(chan struct{})
	go func() { defer close(done); svc.Run(ctx) }()
	hs := httptest.NewServer(svc.Handler())
	t.Cleanup(func() { hs.Close(); cancel(); <-done; p.Close() })
	return &replica{svc: svc, st: st, admin: hs.URL}
}

// put sends PUT /v1/rules as author with reason; it returns the status and version.
func (r *replica) put(t *testing.T, body, author, why string) (int, uint64, string) {
	t.Helper()
	req, _ := http.NewRequest("PUT", r.admin+"/v1/rules", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set(service.ActorHeader, author)
	req.Header.Set(service.ReasonHeader, why)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out struct{ Version uint64 }
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out.Version, string(raw)
}

func (r *replica) versions(t *testing.T) (uint64, []rulestore.Record) {
	t.Helper()
	req, _ := http.NewRequest("GET", r.admin+"/v1/rules/versions", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Current  uint64
		Versions []rulestore.Record
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /v1/rules/versions: %d %v", resp.StatusCode, err)
	}
	return out.Current, out.Versions
}

// redisVersion is the version Redis holds as current, with its body.
func redisVersion(t *testing.T, st *store.Store) (*rulestore.Set, error) {
	t.Helper()
	return rulestore.NewRedis(st.Client()).Current(context.Background())
}

// waitRedis waits up to limit for Redis to hold version v; it returns how long it took.
func waitRedis(t *testing.T, st *store.Store, v uint64, limit time.Duration) (time.Duration, bool) {
	t.Helper()
	// The bound is the product's; what the machine's scheduling added meanwhile (the
	// longest a no-op timer and loopback round trip waited, hostdelay.Probe) is allowed
	// on top of it, so a stall of the host does not read as a slow restore.
	hd, err := hostdelay.Start(5 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer hd.Close()
	start := time.Now()
	for time.Since(start) < limit+10*time.Second {
		if set, err := redisVersion(t, st); err == nil && set.Version == v {
			took := time.Since(start)
			host := hd.Max(start, time.Now())
			if took > limit {
				t.Logf("version %d after %v: bound %v + the host's longest delay meanwhile %v", v, took, limit, host)
			}
			return took, took <= limit+host
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start), false
}

func ruleSet(limit int) string {
	return fmt.Sprintf(`{"rules":[{"id":"search","limit":%d,"window":"1m"}]}`, limit)
}

// TestRestoreAfterFlushAll: three versions pushed through the admin API are kept in
// PostgreSQL with author and reason; after FLUSHALL the service puts the active version
// back into Redis within a second, and the history still lists all three.
func TestRestoreAfterFlushAll(t *testing.T) {
	fresh(t)
	a := startReplica(t, redisA, time.Hour)
	var pushed []uint64
	for i, who := range []string{"alice", "bob", "carol"} {
		code, v, body := a.put(t, ruleSet(10*(i+1)), who, fmt.Sprintf("step %d of the rollout", i+1))
		if code != 200 {
			t.Fatalf("PUT %d: %d %s", i, code, body)
		}
		pushed = append(pushed, v)
	}
	active := pushed[2]
	if _, ok := waitRedis(t, a.st, active, time.Second); !ok {
		t.Fatalf("Redis does not hold version %d after the PUT", active)
	}
	if err := a.st.Client().FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	took, ok := waitRedis(t, a.st, active, time.Second)
	if !ok {
		t.Fatalf("after FLUSHALL Redis did not get version %d back within 1 s", active)
	}
	t.Logf("active version %d back in Redis %v after FLUSHALL", active, took)
	set, _ := redisVersion(t, a.st)
	if !bytes.Contains(set.Body, []byte(`"limit":30`)) {
		t.Errorf("restored body %s, want the third version's (limit 30)", set.Body)
	}
	cur, recs := a.versions(t)
	if cur != active || len(recs) != 3 {
		t.Fatalf("history: current %d, %d versions %+v; want %d and 3", cur, len(recs), recs, active)
	}
	for i, want := range []struct{ by, reason string }{{"carol", "step 3 of the rollout"}, {"bob", "step 2 of the rollout"}, {"alice", "step 1 of the rollout"}} {
		if r := recs[i]; r.Version != pushed[2-i] || r.By != want.by || r.Reason != want.reason || r.Action != "put" || r.At.IsZero() {
			t.Errorf("history[%d] = %+v, want version %d by %s reason %q", i, r, pushed[2-i], want.by, want.reason)
		}
	}
}

// TestReplicaLearnsThroughNotify: a second replica on another Redis, which never reads
// the active version by polling here, gets a version pushed through the first within a
// second: only the policy store's NOTIFY tells it.
func TestReplicaLearnsThroughNotify(t *testing.T) {
	fresh(t)
	a := startReplica(t, redisA, time.Hour)
	b := startReplica(t, redB, time.Hour)
	time.Sleep(200 * time.Millisecond) // both LISTENing
	code, v, body := a.put(t, ruleSet(7), "alice", "seven")
	if code != 200 {
		t.Fatalf("PUT: %d %s", code, body)
	}
	took, ok := waitRedis(t, b.st, v, time.Second)
	if !ok {
		t.Fatalf("replica b's Redis did not get version %d within 1 s", v)
	}
	deadline := time.Now().Add(time.Second)
	for b.svc.Watcher().Version() != v && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := b.svc.Watcher().Version(); got != v {
		t.Fatalf("replica b serves version %d, want %d", got, v)
	}
	t.Logf("replica b had version %d %v after the PUT on a", v, took)
}

// TestPostgresDown: while PostgreSQL is down rule changes are refused with 503 naming
// the policy store, and gateways keep getting the rules from Redis; once it is back,
// changes go through again.
func TestPostgresDown(t *testing.T) {
	fresh(t)
	a := startReplica(t, redisA, time.Hour)
	code, v, body := a.put(t, ruleSet(5), "alice", "before the outage")
	if code != 200 {
		t.Fatalf("PUT: %d %s", code, body)
	}
	pg.Down()
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			_ = pg.Start()
		}
	})
	code, _, body = a.put(t, ruleSet(6), "alice", "during the outage")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "policy store (PostgreSQL) unavailable") {
		t.Errorf("PUT while PostgreSQL is down: %d %s, want 503 naming the policy store", code, body)
	}
	req, _ := http.NewRequest("GET", a.admin+"/v1/sync/rules", nil)
	req.Header.Set("Authorization", "Bearer sync")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(raw, []byte(`"limit":5`)) || resp.Header.Get(service.RulesVersionHeader) != fmt.Sprint(v) {
		t.Errorf("GET /v1/sync/rules while PostgreSQL is down: %d %s (version %s), want version %d's rules", resp.StatusCode, raw, resp.Header.Get(service.RulesVersionHeader), v)
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	restarted = true
	code, v2, body := a.put(t, ruleSet(6), "alice", "after the outage")
	if code != 200 || v2 <= v {
		t.Fatalf("PUT after PostgreSQL is back: %d %s", code, body)
	}
}

// TestStore: the store's compare-and-set, refusals and NOTIFY, on a real PostgreSQL.
func TestStore(t *testing.T) {
	fresh(t)
	ctx := context.Background()
	p, err := postgres.Open(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	heard := make(chan uint64, 8)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go p.Listen(lctx, func(v uint64) { heard <- v })
	if v := <-heard; v != 0 {
		t.Fatalf("first call %d, want 0 (connected)", v)
	}
	for _, tt := range []struct {
		name string
		base uint64 // 0: the active version
		body string
		err  error
	}{
		{"first", 0, ruleSet(1), nil},
		{"second", 0, ruleSet(2), nil},
		{"stale base", 1, ruleSet(3), rulestore.ErrConflict},
		{"invalid", 0, `{"rules":[{"id":"x","limit":0,"window":"1s"}]}`, rulestore.ErrInvalid},
	} {
		t.Run(tt.name, func(t *testing.T) {
			base := tt.base
			if base == 0 {
				if base, err = p.ActiveVersion(ctx); err != nil {
					t.Fatal(err)
				}
			}
			set, err := p.Put(ctx, base, []byte(tt.body), rulestore.Record{By: "t", Action: "put", Reason: tt.name})
			if !errors.Is(err, tt.err) {
				t.Fatalf("Put: %v, want %v", err, tt.err)
			}
			if tt.err != nil {
				return
			}
			select {
			case v := <-heard:
				if v != set.Version {
					t.Errorf("NOTIFY %d, want %d", v, set.Version)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("no NOTIFY")
			}
			got, rec, err := p.Get(ctx, set.Version)
			if err != nil || !bytes.Equal(got.Body, set.Body) || rec.Reason != tt.name {
				t.Errorf("Get = %s %+v %v", got.Body, rec, err)
			}
		})
	}
	if _, _, err := p.Get(ctx, 12345); !errors.Is(err, rulestore.ErrNotFound) {
		t.Errorf("Get(unknown) = %v, want ErrNotFound", err)
	}
	recs, err := p.Versions(ctx, 10)
	if err != nil || len(recs) != 2 || recs[0].Reason != "second" {
		t.Errorf("Versions = %+v %v, want second then first", recs, err)
	}
}

// TestSeedFromRedis: turning the store on over a Redis that holds rules commits them as
// the store's first version (action import), which Redis then holds.
func TestSeedFromRedis(t *testing.T) {
	fresh(t)
	ctx := context.Background()
	st := openStore(t, redisA)
	old, err := rulestore.NewRedis(st.Client()).Put(ctx, 0, []byte(ruleSet(9)), rulestore.Record{By: "before", Action: "put"})
	if err != nil {
		t.Fatal(err)
	}
	a := startReplica(t, redisA, time.Hour)
	var cur uint64
	var recs []rulestore.Record
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		// The import is in the history before the replica serves it as current.
		if cur, recs = a.versions(t); len(recs) == 1 && cur > old {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(recs) != 1 || recs[0].Action != "import" || cur <= old {
		t.Fatalf("history %+v (current %d), want one import above Redis's version %d", recs, cur, old)
	}
	if _, ok := waitRedis(t, a.st, cur, time.Second); !ok {
		t.Fatalf("Redis does not hold the imported version %d", cur)
	}
	set, _ := redisVersion(t, a.st)
	if !bytes.Contains(set.Body, []byte(`"limit":9`)) {
		t.Errorf("imported body %s, want Redis's rules (limit 9)", set.Body)
	}
}

// TestConcurrentFirstUse: replicas that start together on a database without the table
// all create it at once (CREATE TABLE IF NOT EXISTS alone fails on pg_type's unique
// index when two sessions race); every one of them must come up.
func TestConcurrentFirstUse(t *testing.T) {
	ctx := context.Background()
	const replicas = 6
	admin, err := postgres.Open(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for round := range 20 {
		if err := postgres.Drop(ctx, admin); err != nil {
			t.Fatal(err)
		}
		fresh := make([]*postgres.Store, replicas)
		for i := range fresh {
			p, err := postgres.Open(ctx, pg.URL())
			if err != nil {
				t.Fatal(err)
			}
			fresh[i] = p
		}
		errs := make(chan error, replicas)
		for _, p := range fresh {
			go func() { errs <- p.Ping(ctx) }()
		}
		for range replicas {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		for _, p := range fresh {
			p.Close()
		}
	}
}

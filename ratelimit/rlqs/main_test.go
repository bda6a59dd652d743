package rlqs

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/rls"
	"github.com/tollgate-rl/tollgate/ratelimit/rulestore"
	"github.com/tollgate-rl/tollgate/ratelimit/service"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
)

var (
	standalone *redistest.Server
	cluster    *redistest.Cluster
)

func TestMain(m *testing.M) {
	store.RouteRedisLogs(slog.New(slog.DiscardHandler))
	os.Exit(redistest.RunPackage(m, "rlqs tests", &standalone, &cluster))
}

const (
	secret     = "rlqs-s3cret"
	adminToken = "rlqs-admin"
)

// env is one sync service with the RLS server's gRPC listener serving RLQS too, as
// tollgate-ratelimit wires it, and its admin API.
type env struct {
	svc   *service.Service
	srv   *Server
	st    *store.Store
	addr  string // the gRPC listener
	admin string // the admin API's base URL
	stop  func()
}

func start(t testing.TB, o Options) *env { t.Helper(); return startAt(t, o, "127.0.0.1:0") }

// startAt is start with the gRPC listener on addr (a restarted service takes its
// predecessor's).
func startAt(t testing.TB, o Options, addr string) *env {
	t.Helper()
	return startOn(t, o, addr, standalone.Addrs())
}

// startOn is startAt on the Redis at redisAddrs (a test that stops its Redis).
func startOn(t testing.TB, o Options, addr string, redisAddrs []string) *env {
	t.Helper()
	cfg := store.Config{Mode: store.Standalone, Addrs: redisAddrs}
	m := service.NewMetrics()
	st, err := store.Open(cfg, m)
	if err != nil {
		t.Fatal(err)
	}
	svc := service.New(service.Config{SyncSecret: secret, AdminToken: adminToken, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, st, m)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("RLQS_DEBUG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	rl := rls.New(svc, log, rls.LeaseOptions{Off: true})
	g := rl.GRPCServer()
	srv := New(svc, log, o)
	srv.Register(g)
	go func() { _ = g.Serve(ln) }()
	admin := httptest.NewServer(svc.AdminHandler())
	bg, cancel := context.WithCancel(context.Background())
	go svc.Run(bg)
	e := &env{svc: svc, srv: srv, st: st, addr: ln.Addr().String(), admin: admin.URL}
	stopped := false
	e.stop = func() {
		if stopped {
			return
		}
		stopped = true
		srv.Close() // as tollgate-ratelimit stops: TTL-0 first, then a graceful stop
		g.GracefulStop()
		rl.Close()
	}
	t.Cleanup(func() {
		e.stop()
		cancel()
		admin.Close()
		_ = st.Close()
	})
	return e
}

// putRules makes body the service's rule set.
func (e *env) putRules(t testing.TB, body string) {
	t.Helper()
	ctx := context.Background()
	rs := rulestore.NewRedis(e.st.Client())
	cur, err := rs.CurrentVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	v, err := rs.Put(ctx, cur, []byte(body), rulestore.Record{By: "test", Action: "put"})
	if err != nil {
		t.Fatal(err)
	}
	e.svc.Watcher().Observe(v)
}

// consumed is what the admin API says key's bucket of rule has had charged: its
// capacity less what remains, leases counted as taken.
func (e *env) consumed(t testing.TB, key, ruleID string, capacity int64) int64 {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.admin+"/v1/usage/"+key, nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var u struct {
		Buckets []struct {
			Rule        string
			Remaining   int64
			Outstanding int64
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&u); err != nil {
		t.Fatal(err)
	}
	for _, b := range u.Buckets {
		if b.Rule == ruleID {
			return capacity - b.Remaining - b.Outstanding
		}
	}
	return 0
}

var uniqN atomic.Int64

// uniq names a test's caller keys: the package's tests share Redis.
func uniq(prefix string) string {
	return fmt.Sprintf("%s-%d-%d-%d", prefix, os.Getpid(), time.Now().UnixNano()%1e6, uniqN.Add(1))
}

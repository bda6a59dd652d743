package rls

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/rulestore"
	"github.com/tollgate-rl/tollgate/ratelimit/service"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/lease"
)

var (
	standalone *redistest.Server
	cluster    *redistest.Cluster
)

func TestMain(m *testing.M) {
	store.RouteRedisLogs(slog.New(slog.DiscardHandler))
	os.Exit(redistest.RunPackage(m, "rls tests", &standalone, &cluster))
}

const secret = "rls-s3cret"

// env is one sync service with its gRPC rate limit service on a real listener, and a
// real gRPC client.
type env struct {
	svc    *service.Service
	srv    *Server
	st     *store.Store
	client rlsv3.RateLimitServiceClient
	addr   string // the gRPC listener
}

type opts struct {
	mode     store.Mode
	addrs    []string
	insecure bool
	store    func(*store.Config)
	leases   LeaseOptions // Off: every descriptor a strict check
}

func start(t testing.TB, o opts) *env {
	t.Helper()
	if o.mode == "" {
		o.mode = store.Standalone
	}
	if o.addrs == nil {
		if o.mode == store.Cluster {
			o.addrs = cluster.Addrs()
		} else {
			o.addrs = standalone.Addrs()
		}
	}
	cfg := store.Config{Mode: o.mode, Addrs: o.addrs, Lease: lease.SyncConfig{EpochMs: 2000, HorizonMs: 1000, MaxShare: 4, RenewMs: 200,
		PenaltyBaseUs: 1_000_000, PenaltyMaxUs: 8_000_000}}
	if o.store != nil {
		o.store(&cfg)
	}
	m := service.NewMetrics()
	st, err := store.Open(cfg, m)
	if err != nil {
		t.Fatal(err)
	}
	sc := service.Config{SyncSecret: secret, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if o.insecure {
		sc.SyncSecret, sc.Insecure = "", true
	}
	svc := service.New(sc, st, m)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := New(svc, slog.New(slog.NewTextHandler(io.Discard, nil)), o.leases)
	g := srv.GRPCServer()
	go func() { _ = g.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		g.Stop()
		srv.Close()
		_ = st.Close()
	})
	return &env{svc: svc, srv: srv, st: st, client: rlsv3.NewRateLimitServiceClient(conn), addr: ln.Addr().String()}
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

// call sends ShouldRateLimit with the bearer (token "" sends none).
func (e *env) call(t testing.TB, token string, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	t.Helper()
	ctx := context.Background()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	return e.client.ShouldRateLimit(ctx, req)
}

var uniqN atomic.Int64

// uniq names a test's caller keys: the package's tests share Redis.
func uniq(prefix string) string { return fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), uniqN.Add(1)) }

// testutilCount is how many calls the service answered with code.
func testutilCount(e *env, code string) float64 {
	return testutil.ToFloat64(e.srv.m.requests.WithLabelValues(code))
}

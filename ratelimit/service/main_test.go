package service

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

var (
	standalone *redistest.Server
	cluster    *redistest.Cluster
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	store.RouteRedisLogs(slog.New(slog.DiscardHandler))
	return redistest.RunPackage(m, "service tests", &standalone, &cluster)
}

const (
	syncSecret = "sync-s3cret"
	adminToken = "admin-t0ken"
)

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// instance is one running service.
type instance struct {
	svc  *Service
	st   *store.Store
	http *httptest.Server
	log  *syncBuffer
	// id makes the gateway names of one test its own: the package shares one Redis, and
	// a gateway's idempotency records outlive the test that wrote them.
	id string
	// stop ends the instance before the test does (a replica's restart).
	stop func()
}

type opts struct {
	mode  store.Mode
	addrs []string
	store func(*store.Config)
	svc   func(*Config)
}

func start(t testing.TB, o opts) *instance {
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
	cfg := store.Config{Mode: o.mode, Addrs: o.addrs, Lease: lease.SyncConfig{EpochMs: 2000, HorizonMs: 1000, MaxShare: 4, RenewMs: 200, PenaltyBaseUs: 1_000_000, PenaltyMaxUs: 8_000_000}}
	if o.store != nil {
		o.store(&cfg)
	}
	m := NewMetrics()
	st, err := store.Open(cfg, m)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	sc := Config{SyncSecret: syncSecret, AdminToken: adminToken, Logger: slog.New(slog.NewJSONHandler(logs, nil))}
	if o.svc != nil {
		o.svc(&sc)
	}
	svc := New(sc, st, m)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); svc.Run(ctx) }()
	hs := httptest.NewServer(svc.Handler())
	stop := sync.OnceFunc(func() {
		hs.Close()
		cancel()
		<-done
		_ = st.Close()
	})
	t.Cleanup(stop)
	return &instance{svc: svc, st: st, http: hs, log: logs, id: uniq("t"), stop: stop}
}

// do sends a request and returns status, headers and body.
func (in *instance) do(t testing.TB, method, path, token string, body []byte, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, in.http.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

// sync posts a batch to path and decodes the reply (status 200 required).
func (in *instance) sync(t testing.TB, path string, b *wire.Batch) *wire.Reply {
	t.Helper()
	own := *b
	own.Node = b.Node + "@" + in.id
	body, err := wire.AppendBatch(nil, &own)
	if err != nil {
		t.Fatal(err)
	}
	code, _, out := in.do(t, http.MethodPost, path, syncSecret, body, "Content-Type", "application/octet-stream")
	if code != http.StatusOK {
		t.Fatalf("POST %s: %d %s", path, code, out)
	}
	var r wire.Reply
	if err := wire.DecodeReply(out, &r); err != nil {
		t.Fatalf("reply: %v", err)
	}
	if len(r.States) != len(b.Deltas) {
		t.Fatalf("%d states for %d deltas", len(r.States), len(b.Deltas))
	}
	return &r
}

// eventually polls cond until it holds or the bound passes (bounded waits, not timing
// assertions: the bound is generous and only a hang fails).
func eventually(t testing.TB, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(bound); ; time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, bound)
		}
	}
}

func uniq(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
}

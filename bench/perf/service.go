package perf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-rl/tollgate/ratelimit/service"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/lease"
)

// SyncSecret is the sync secret of the benchmark's service.
const SyncSecret = "bench-s3cret"

// Service is a sync service running in this process on a real listener, with a count
// of the Redis round trips (pipelines) its store makes.
type Service struct {
	Addr  string // host:port of the HTTP listener
	URL   string
	Store *store.Store
	Mode  store.Mode
	Svc   *service.Service

	trips *tripCounter
	srv   *http.Server
	stop  context.CancelFunc
	done  sync.WaitGroup
}

// tripCounter forwards the store's observations to the service's metrics and counts
// round trips by operation.
type tripCounter struct {
	*service.Metrics
	mu    sync.Mutex
	byOp  map[string]int64
	total atomic.Int64
}

func (c *tripCounter) RoundTrip(op string, d time.Duration, err error) {
	c.Metrics.RoundTrip(op, d, err)
	c.total.Add(1)
	c.mu.Lock()
	c.byOp[op]++
	c.mu.Unlock()
}

// StartService opens a store on addrs and serves the sync API on 127.0.0.1, with the
// service's default lease settings.
func StartService(mode store.Mode, addrs []string) (*Service, error) {
	return StartServiceWith(mode, addrs, nil)
}

// StartServiceWith is StartService with the service's configuration adjusted by adjust
// (when not nil).
func StartServiceWith(mode store.Mode, addrs []string, adjust func(*service.Config)) (*Service, error) {
	store.RouteRedisLogs(slog.New(slog.DiscardHandler))
	m := service.NewMetrics()
	tc := &tripCounter{Metrics: m, byOp: map[string]int64{}}
	st, err := store.Open(store.Config{Mode: mode, Addrs: addrs, Lease: lease.DefaultSyncConfig}, tc)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	cfg := service.Config{SyncSecret: SyncSecret, AdminToken: AdminToken, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if adjust != nil {
		adjust(&cfg)
	}
	svc := service.New(cfg, st, m)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = st.Close()
		return nil, fmt.Errorf("listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{Addr: l.Addr().String(), URL: "http://" + l.Addr().String(), Store: st, Mode: mode, Svc: svc, trips: tc, stop: cancel,
		srv: &http.Server{Handler: svc.Handler(), ReadHeaderTimeout: 5 * time.Second}}
	s.done.Add(2)
	go func() { defer s.done.Done(); svc.Run(ctx) }()
	go func() {
		defer s.done.Done()
		if err := s.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Error("bench service", "err", err)
		}
	}()
	return s, nil
}

// RoundTrips is the number of Redis round trips the store has made so far, in all and
// by operation ("sync", ...).
func (s *Service) RoundTrips() (int64, map[string]int64) {
	s.trips.mu.Lock()
	defer s.trips.mu.Unlock()
	by := make(map[string]int64, len(s.trips.byOp))
	for k, v := range s.trips.byOp {
		by[k] = v
	}
	return s.trips.total.Load(), by
}

// Close stops the service.
func (s *Service) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
	s.stop()
	s.done.Wait()
	_ = s.Store.Close()
}

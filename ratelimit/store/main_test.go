package store

import (
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/shared/lease"
)

// One standalone server and one cluster for the whole package (start-up is most of the
// cost of these tests).
var (
	standalone *redistest.Server
	cluster    *redistest.Cluster
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	RouteRedisLogs(slog.New(slog.DiscardHandler))
	return redistest.RunPackage(m, "store tests", &standalone, &cluster)
}

var testLease = lease.SyncConfig{EpochMs: 2000, HorizonMs: 1000, MaxShare: 4, RenewMs: 200, MinElapsedMs: 100, ValidMarginMs: 100, PenaltyBaseUs: 1_000_000, PenaltyMaxUs: 8_000_000}

// countingMetrics counts script reloads, failed round trips and the batches' round
// trips (op "sync").
type countingMetrics struct {
	reloads atomic.Int64
	errors  atomic.Int64
	syncs   atomic.Int64
}

func (c *countingMetrics) RoundTrip(op string, _ time.Duration, err error) {
	if op == "sync" {
		c.syncs.Add(1)
	}
	if err != nil && err != redis.Nil {
		c.errors.Add(1)
	}
}
func (c *countingMetrics) ScriptReload() { c.reloads.Add(1) }

// newStore opens a store on the shared standalone server or the cluster.
func newStore(t testing.TB, mode Mode, tweak func(*Config)) (*Store, *countingMetrics) {
	t.Helper()
	cfg := Config{Mode: mode, Lease: testLease}
	switch mode {
	case Cluster:
		cfg.Addrs = cluster.Addrs()
	default:
		cfg.Addrs = standalone.Addrs()
	}
	if tweak != nil {
		tweak(&cfg)
	}
	m := &countingMetrics{}
	s, err := Open(cfg, m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, m
}

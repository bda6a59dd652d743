package store

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/internal/backend"
	"github.com/tollgate-rl/tollgate/internal/backendtest"
	"github.com/tollgate-rl/tollgate/internal/memservice"
)

// TestConformance holds the store to the backend contract (internal/backendtest), the
// one the in-memory service is held to, on a server and on a cluster. Each case starts
// from an empty Redis: the fleet set is global, so a case's gateways must be the only
// ones it counts.
func TestConformance(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			backendtest.Run(t, func(t *testing.T, su backendtest.Setup) backend.Backend {
				return emptyStore(t, mode, su)
			})
		})
	}
}

// emptyStore is a store on an emptied Redis (every primary flushed) whose scripts and
// fleet count read su's clock.
func emptyStore(t *testing.T, mode Mode, su backendtest.Setup) *Store {
	s, _ := newStore(t, mode, func(c *Config) { c.Lease = su.Lease })
	ctx := context.Background()
	var err error
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.FlushAll(ctx).Err() })
	} else {
		err = s.rdb.FlushAll(ctx).Err()
	}
	if err != nil {
		t.Fatal(err)
	}
	s.SetTestClock(su.Clock.Now)
	s.fleetNowUs = su.Clock.Now
	return s
}

// TestMemserviceAgrees runs the conformance cases on the store and on the in-memory
// service in lockstep: every answer of the in-memory service (which the fleet simulation
// and the filter's native tests sync against) must equal the store's, field for field.
func TestMemserviceAgrees(t *testing.T) {
	backendtest.Compare(t, func(t *testing.T, su backendtest.Setup) backend.Backend {
		return emptyStore(t, Standalone, su)
	}, func(t *testing.T, su backendtest.Setup) backend.Backend {
		return memservice.New(su.Lease).Backend(su.Clock.Now)
	})
}

package memservice

import (
	"testing"

	"github.com/tollgate-rl/tollgate/internal/backend"
	"github.com/tollgate-rl/tollgate/internal/backendtest"
)

// TestConformance holds the in-memory service to the backend contract the Redis store
// is held to (internal/backendtest).
func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T, s backendtest.Setup) backend.Backend {
		return New(s.Lease).Backend(s.Clock.Now)
	})
}

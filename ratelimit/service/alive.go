package service

import (
	"context"
	"io"
	"net/http"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
)

// The gateways' liveness probe (wire.AlivePath). A gateway whose sync is slow asks it
// every half sync interval; a 200 keeps the gateway from counting the service down for
// a sync that is merely slow. It answers 200 only when every Redis primary answers a
// PING within aliveBudget: a Redis that has stalled (paused, hung, partitioned) turns
// the gateways degraded as fast as a service that stopped answering, instead of after
// their syncs time out a breaker's worth of times (RATIONALE.md §3, "Degraded").
//
// One PING round serves every probe that arrives while it runs and for aliveTTL after
// (singleflight): a thousand gateways probing a slow Redis cost it at most one round per
// aliveTTL per replica.
const (
	// aliveBudget bounds the PING round. A Redis that is busy but answering replies to a
	// PING in well under a millisecond here (BENCHMARKS: its command latency at
	// saturation); 50 ms is far beyond that and well inside the gateway's two-interval
	// bound (200 ms at the default interval).
	aliveBudget = 50 * time.Millisecond
	// aliveTTL is how long an answer is reused: short, so a Redis that stalls just after
	// a PING is not vouched for much longer.
	aliveTTL = 10 * time.Millisecond
)

type aliveCache struct {
	group singleflight.Group
	mu    sync.Mutex
	at    time.Time
	err   error
}

// handleAlive answers wire.AlivePath.
func (s *Service) handleAlive(w http.ResponseWriter, r *http.Request) {
	if err := s.redisAlive(r.Context()); err != nil {
		s.m.error("alive")
		http.Error(w, "redis: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	_, _ = io.WriteString(w, "ok\n")
}

// redisAlive is the last PING round's outcome if it is younger than aliveTTL, else a
// new round's (shared by concurrent callers).
func (s *Service) redisAlive(ctx context.Context) error {
	c := &s.alive
	c.mu.Lock()
	if !c.at.IsZero() && time.Since(c.at) < aliveTTL {
		err := c.err
		c.mu.Unlock()
		return err
	}
	c.mu.Unlock()
	_, err, _ := c.group.Do("ping", func() (any, error) {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), aliveBudget)
		defer cancel()
		err := s.be.Ping(pctx)
		c.mu.Lock()
		c.at, c.err = time.Now(), err
		c.mu.Unlock()
		return nil, err
	})
	return err
}

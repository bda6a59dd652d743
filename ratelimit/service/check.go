package service

import (
	"context"
	"time"

	"github.com/tollgate-rl/tollgate/internal/backend"
	"github.com/tollgate-rl/tollgate/shared/rule"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// RuleSet returns the service's current rule set (parsed once per version), or nil
// while none has been pushed.
func (s *Service) RuleSet(ctx context.Context) *rule.Config { return s.ruleSet(ctx) }

// Check decides b's deltas as /v1/check does — every delta a strict check (FlagStrict
// unless it asks to acquire), limits resolved from the service's rule set, nothing
// recorded for replay — and counts it under endpoint in the batch metrics. Other front
// ends (the Envoy rate limit service) charge the same buckets through it.
func (s *Service) Check(ctx context.Context, endpoint string, b *wire.Batch) (*backend.Outcome, error) {
	start := time.Now()
	if !s.rulesReady() {
		s.m.error("no_rules")
		s.m.batches.WithLabelValues(endpoint, "unavailable").Inc()
		return nil, errNoRules
	}
	for i := range b.Deltas {
		if b.Deltas[i].Flags&(wire.FlagStrict|wire.FlagAcquire) == 0 {
			b.Deltas[i].Flags |= wire.FlagStrict
		}
	}
	refuse := s.resolver(ctx)
	opts := backend.Options{Refuse: refuse, NoLearn: refuse != nil, StoreKey: s.storeKeyFunc(s.ruleSet(ctx))}
	// A caller that hangs up must not cut a check in half: finish it (bounded).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.BatchTimeout)
	out, err := s.be.Apply(ctx, b, opts)
	cancel()
	outcome := "ok"
	switch {
	case err == nil:
		s.m.batch(endpoint, b, out.Results, out.States)
		s.m.fleet.Set(float64(out.Nodes))
	case ctx.Err() != nil:
		outcome = "unavailable"
		s.m.error("timeout")
	default:
		outcome = "unavailable"
		s.m.error("redis")
	}
	s.m.batches.WithLabelValues(endpoint, outcome).Inc()
	s.m.batchSeconds.WithLabelValues(endpoint).Observe(time.Since(start).Seconds())
	return out, err
}

// Sync applies b as /v1/sync does — exactly once per (node, seq): a resent batch is
// answered from the idempotency records; leases granted and renewed — for a node that
// lives in this process (the rate limit service's replicas, which decide from leases as
// gateways do). A batch without deltas (a heartbeat: the fleet keeps counting the node)
// pings Redis, so that its answer says Redis is up. With grant false no lease is granted
// (a node's last report, which gives its leases back). It counts under endpoint in the
// batch metrics.
func (s *Service) Sync(ctx context.Context, endpoint string, b *wire.Batch, grant bool) (*backend.Outcome, error) {
	start := time.Now()
	if !s.rulesReady() {
		s.m.error("no_rules")
		s.m.batches.WithLabelValues(endpoint, "unavailable").Inc()
		return nil, errNoRules
	}
	refuse := s.resolver(ctx)
	opts := backend.Options{Idempotent: true, NoLease: !grant, Refuse: refuse, NoLearn: refuse != nil, StoreKey: s.storeKeyFunc(s.ruleSet(ctx))}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.BatchTimeout)
	out, err := s.be.Apply(ctx, b, opts)
	if err == nil && len(b.Deltas) == 0 {
		err = s.be.Ping(ctx)
	}
	cancel()
	outcome := "ok"
	if err == nil {
		s.m.batch(endpoint, b, out.Results, out.States)
		s.observeTop(b, out.Results, out.States)
		s.m.fleet.Set(float64(out.Nodes))
	} else {
		outcome = "unavailable"
		s.m.error("redis")
	}
	s.m.batches.WithLabelValues(endpoint, outcome).Inc()
	s.m.batchSeconds.WithLabelValues(endpoint).Observe(time.Since(start).Seconds())
	return out, err
}

package service

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-rl/tollgate/internal/backend"
	"github.com/tollgate-rl/tollgate/ratelimit/rulestore"
)

// fleetMetrics are the metrics of the identity and rule-keeping code (their own
// struct, registered by NewMetrics).
type fleetMetrics struct {
	auth        *prometheus.CounterVec // mode
	writtenBack prometheus.Counter
	rulesReady  prometheus.Gauge
}

func newFleetMetrics(register func(prometheus.Collector)) *fleetMetrics {
	m := &fleetMetrics{
		auth: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_sync_auth_total",
			Help: "Authenticated sync, check and rules requests by credential: node_token (bound to its node), mesh (the mTLS peer's SPIFFE id scopes the node), shared_secret (the master secret itself: may name any node; upgrades only), insecure."}, []string{"mode"}),
		writtenBack: prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_rules_written_back_total",
			Help: "Times this instance wrote the rule set it enforces back into Redis, which held an older one (a wipe of Redis)."}),
		rulesReady: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_rules_ready",
			Help: "1 when this instance knows which rule set to enforce; 0 while, with a policy store, it has none and the policy store has not answered (sync and check answer 503, gateways use their rules' fail modes)."}),
	}
	for _, c := range []prometheus.Collector{m.auth, m.writtenBack, m.rulesReady} {
		register(c)
	}
	return m
}

// errNoRules: with a policy store this instance has no rule set and cannot learn whether
// it should have one. Deciding with none would admit everything its peers refuse.
var errNoRules = fmt.Errorf("%w: no rule set yet: Redis holds none and the policy store has not answered", backend.ErrUnavailable)

// rulesReady reports whether this instance knows what to enforce. Without a policy
// store Redis is the only source, and an empty Redis means no rules (a running peer
// writes back what it enforces, see keepRules). With one, an instance that holds no
// rule set waits for the policy store to say which is active (possibly none): until
// then it is not ready and answers sync and check with 503, so gateways decide with
// their own rules' fail modes instead of being told every request is admitted.
func (s *Service) rulesReady() bool {
	ready := s.pol == nil || s.watcher.Version() > 0 || (s.pol.answered.Load() && s.pol.known.Load() == 0)
	s.m.fleetx.rulesReady.Set(b2f(ready))
	return ready
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// keepRules writes the rule set this instance enforces back into Redis whenever Redis
// holds an older version (it lost its data: FLUSHALL, a restart without persistence),
// every RestoreInterval, until ctx ends. With the policy store down too, the running
// instances are the only ones that still know the rules; written back, they reach every
// instance (a restarted one included) and every gateway, and the admin API reads them
// again. Versions only grow, so a newer version (written by an operator or restored
// from the policy store) is never replaced.
func (s *Service) keepRules(ctx context.Context) {
	t := time.NewTicker(RestoreInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.writeBack(ctx)
	}
}

// writeBack is one round of keepRules.
func (s *Service) writeBack(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	s.rulesReady()
	set := s.watcher.Enforced()
	if set == nil || set.Version < s.watcher.Version() {
		// Cache the body of the newest version while Redis still has it.
		if cur, err := s.watcher.Current(rctx); err == nil {
			set = cur
		}
	}
	if set == nil || set.Version == 0 {
		return
	}
	cur, err := s.rules.CurrentVersion(rctx)
	if err != nil || cur >= set.Version {
		return
	}
	wrote, err := s.rules.Install(rctx, set, rulestore.Record{By: "tollgate-ratelimit", Action: "restore",
		Reason: "Redis held version " + strconv.FormatUint(cur, 10) + ": written back from the rule set an instance enforces"})
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			s.log.Warn("writing the enforced rules version back into Redis failed", "version", set.Version, "err", err)
		}
		return
	}
	if wrote {
		s.m.fleetx.writtenBack.Inc()
		s.log.Warn("Redis had lost the rule set: wrote back the version this instance enforces", "version", set.Version, "redis_had", cur)
	}
}

// observe makes version v, which this instance just wrote, current here and caches its
// body, so that a wipe of Redis right after a change still finds it to write back.
func (s *Service) observe(ctx context.Context, v uint64) {
	s.watcher.Observe(v)
	_, _ = s.watcher.Current(ctx)
}

package service

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/tollgate-rl/tollgate/ratelimit/rulestore"
	"github.com/tollgate-rl/tollgate/ratelimit/rulestore/postgres"
)

// ReasonHeader says why an admin change is made; it is kept with the version.
const ReasonHeader = "X-Tollgate-Reason"

func reason(r *http.Request) string {
	a := r.Header.Get(ReasonHeader)
	if len(a) > 256 {
		a = a[:256]
	}
	return a
}

// PolicyStore is the durable policy store (package rulestore/postgres): with one, every
// rule change is committed there first and Redis holds a copy.
type PolicyStore interface {
	Active(ctx context.Context) (*rulestore.Set, rulestore.Record, error)
	ActiveVersion(ctx context.Context) (uint64, error)
	Get(ctx context.Context, v uint64) (*rulestore.Set, rulestore.Record, error)
	Versions(ctx context.Context, limit int) ([]rulestore.Record, error)
	Put(ctx context.Context, base uint64, body []byte, rec rulestore.Record) (*rulestore.Set, error)
	Listen(ctx context.Context, fn func(v uint64))
}

// RestoreInterval is how often a service with a policy store compares Redis's current
// version with the active one (and puts the active one back when Redis lost it).
const RestoreInterval = 100 * time.Millisecond

// durable is the policy-store side of a Service.
type durable struct {
	pol      PolicyStore
	known    atomic.Uint64 // newest active version seen
	answered atomic.Bool   // the policy store said which version is active
}

func raise(a *atomic.Uint64, v uint64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

// updateRules makes change's result the next version: in the policy store first when
// there is one (its failure refuses the change), then in Redis.
func (s *Service) updateRules(ctx context.Context, rec rulestore.Record, change func(cur *rulestore.Set) ([]byte, error)) (uint64, error) {
	if s.pol == nil {
		return s.rules.Update(ctx, rec, change)
	}
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		var cur *rulestore.Set
		if cur, _, err = s.pol.pol.Active(ctx); err != nil {
			return 0, err
		}
		var body []byte
		if body, err = change(cur); err != nil {
			return 0, err
		}
		var set *rulestore.Set
		if set, err = s.pol.pol.Put(ctx, cur.Version, body, rec); err == nil {
			raise(&s.pol.known, set.Version)
			rec.Version = set.Version
			if _, ierr := s.rules.Install(ctx, set, rec); ierr != nil {
				// Committed: the restore loop installs it once Redis answers.
				s.log.Warn("rules version committed to the policy store, not yet to Redis", "version", set.Version, "err", ierr)
			}
			return set.Version, nil
		}
		if !errors.Is(err, rulestore.ErrConflict) {
			return 0, err
		}
	}
	return 0, err
}

// ruleVersions is the current version and the version records (the policy store's when
// there is one: every version with its reason).
func (s *Service) ruleVersions(ctx context.Context) (uint64, []rulestore.Record, error) {
	if s.pol == nil {
		cur, err := s.rules.CurrentVersion(ctx)
		if err != nil {
			return 0, nil, err
		}
		recs, err := s.rules.Versions(ctx)
		return cur, recs, err
	}
	cur, err := s.pol.pol.ActiveVersion(ctx)
	if err != nil {
		return 0, nil, err
	}
	recs, err := s.pol.pol.Versions(ctx, rulestore.Keep)
	return cur, recs, err
}

// ruleVersion is version v's body, for a rollback.
func (s *Service) ruleVersion(ctx context.Context, v uint64) (*rulestore.Set, error) {
	if s.pol == nil {
		return s.rules.Get(ctx, v)
	}
	set, _, err := s.pol.pol.Get(ctx, v)
	return set, err
}

// storeError answers a failed read or write of the rules' stores: 503, naming which.
func (s *Service) storeError(w http.ResponseWriter, err error) {
	if errors.Is(err, postgres.ErrUnavailable) {
		s.m.error("policy")
		s.log.Warn("admin request refused: policy store unavailable", "err", err)
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	s.redisError(w, err)
}

// runPolicy keeps Redis holding the policy store's active version: it learns new
// versions through LISTEN/NOTIFY (from any replica, on any Redis) and by reading the
// active version every PolicyPoll, and every RestoreInterval installs the active version
// into Redis when Redis holds an older one (after FLUSHALL or a new Redis: none).
func (s *Service) runPolicy(ctx context.Context) {
	wake := make(chan struct{}, 1)
	poke := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	refresh := func() {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if v, err := s.pol.pol.ActiveVersion(pctx); err == nil {
			raise(&s.pol.known, v)
			s.pol.answered.Store(true)
		}
	}
	seeded := s.seedPolicy(ctx)
	go s.pol.pol.Listen(ctx, func(v uint64) {
		if v == 0 {
			refresh()
		} else {
			raise(&s.pol.known, v)
		}
		poke()
	})
	t := time.NewTicker(RestoreInterval)
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-wake:
		}
		if !seeded {
			seeded = s.seedPolicy(ctx)
		}
		if time.Since(last) >= s.cfg.PolicyPoll {
			refresh()
			last = time.Now()
		}
		s.restore(ctx)
	}
}

// restore installs the active version into Redis when Redis holds an older one.
func (s *Service) restore(ctx context.Context) {
	want := s.pol.known.Load()
	if want == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	cur, err := s.rules.CurrentVersion(rctx)
	if err != nil || cur >= want {
		return
	}
	set, rec, err := s.pol.pol.Get(rctx, want)
	if err != nil {
		return
	}
	wrote, err := s.rules.Install(rctx, set, rec)
	if err != nil {
		s.log.Warn("installing the active rules version into Redis failed", "version", want, "err", err)
		return
	}
	if wrote {
		s.log.Info("rules version installed into Redis from the policy store", "version", want, "redis_had", cur)
	}
	s.watcher.Observe(want)
}

// seedPolicy commits Redis's current rule set as the policy store's first version when
// the store is empty, so turning the store on keeps the rules in force. It reports
// whether that question is settled (false: a store did not answer; asked again later).
func (s *Service) seedPolicy(ctx context.Context) bool {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	v, err := s.pol.pol.ActiveVersion(pctx)
	if err != nil {
		return false
	}
	raise(&s.pol.known, v)
	s.pol.answered.Store(true)
	if v > 0 {
		return true
	}
	cur, err := s.rules.Current(pctx)
	if err != nil {
		return false
	}
	if cur.Version == 0 {
		return true
	}
	set, err := s.pol.pol.Put(pctx, 0, cur.Body, rulestore.Record{By: "tollgate-ratelimit", Action: "import",
		Reason: "policy store was empty: Redis's current rules"})
	if errors.Is(err, rulestore.ErrConflict) {
		return true // another replica seeded it
	}
	if err != nil {
		return false
	}
	raise(&s.pol.known, set.Version)
	s.log.Info("policy store seeded with Redis's current rules", "redis_version", cur.Version, "version", set.Version)
	return true
}

package service

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/rule"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// ruleCache holds the current rule set parsed, once per version.
type ruleCache struct {
	mu      sync.Mutex
	version uint64
	cfg     *rule.Config
}

// ruleSet returns the service's current rule set, or nil when none was pushed (then the
// gateways' own rules, from their plugin configuration, are what the service applies).
func (s *Service) ruleSet(ctx context.Context) *rule.Config {
	if s.watcher.Version() == 0 {
		return nil
	}
	set, err := s.watcher.Current(ctx)
	if err != nil || set == nil || set.Version == 0 {
		return nil
	}
	s.rc.mu.Lock()
	defer s.rc.mu.Unlock()
	if s.rc.version != set.Version {
		cfg, err := rule.Parse(set.Body)
		if err != nil {
			// The rules API validated it when it was stored; keep the previous one.
			s.log.Error("stored rule set does not parse", "version", set.Version, "err", err)
			return s.rc.cfg
		}
		s.rc.version, s.rc.cfg = set.Version, cfg
	}
	return s.rc.cfg
}

// resolver returns the store's check for the deltas of a batch: with a rule set at the
// service, a delta of a rule it does not know is refused, and the limits applied are the
// service's own for that rule, tier and caller key — whatever the gateway sent. A gateway
// still on the previous version of a rule is charged under the current one (the rule's
// id is what identifies its buckets), so a rules rollout loses no permits; a gateway
// cannot raise its limits by sending other parameters.
func (s *Service) resolver(ctx context.Context) func(d *wire.Delta) string {
	cfg := s.ruleSet(ctx)
	if cfg == nil {
		return nil
	}
	version := strconv.FormatUint(cfg.Version, 10)
	return func(d *wire.Delta) string {
		r := cfg.RuleByID(d.Rule)
		if r == nil {
			return "rule: not in the service's rule set version " + version
		}
		// A tier the rule does not define would name a bucket of its own with the
		// rule's default limits: a gateway could make as many as it likes.
		if _, ok := r.Tiers[d.Tier]; d.Tier != "" && !ok {
			return "tier: rule " + strconv.Quote(d.Rule) + " has no tier " + strconv.Quote(d.Tier)
		}
		prm, ok := r.Params(d.Key, d.Tier, int(d.Window))
		if !ok {
			return "window: rule " + strconv.Quote(d.Rule) + " has no window " + strconv.Itoa(int(d.Window))
		}
		if prm != lease.ParamsOf(d) {
			s.m.paramsCorrected.Inc()
		}
		setParams(d, prm)
		return ""
	}
}

// bucketRefs names every bucket caller key can have under cfg, with the parameters the
// resolver charges it with: each rule's windows for no tier and for each of its tiers.
// This is what the admin API's usage and reset look at: bounded by the rule set, and
// rebuilt from it whenever Redis lost its data, whatever gateways sent.
func bucketRefs(cfg *rule.Config, key string) []store.BucketRef {
	var refs []store.BucketRef
	for i := range cfg.Rules {
		r := &cfg.Rules[i]
		tiers := make([]string, 0, 1+len(r.Tiers))
		tiers = append(tiers, "")
		for t := range r.Tiers {
			tiers = append(tiers, t)
		}
		for _, t := range tiers {
			for w := 0; w <= 255; w++ {
				p, ok := r.Params(key, t, w)
				if !ok {
					break
				}
				refs = append(refs, store.BucketRef{Rule: r.ID, Tier: t, Window: uint8(w), Params: p})
			}
		}
	}
	store.SortBuckets(refs)
	return refs
}

func setParams(d *wire.Delta, p algo.Params) {
	d.Algo, d.Limit, d.WindowMs, d.Burst = uint8(p.Kind), uint32(p.Limit), uint32(p.WindowUs/1000), uint32(p.Burst)
}

// maxSeqAhead is how far a batch's seq may run ahead of the service's clock (gateways
// start their seqs at their own clock, in µs; this is the clock skew tolerated). A seq
// further ahead is refused: recorded, it would make the gateway's next real batches look
// like replays and never be charged.
const maxSeqAhead = 10 * time.Minute

// seqProblem explains why a batch's seq cannot be accepted ("" when it can).
func seqProblem(seq uint64, now time.Time) string {
	if limit := uint64(now.Add(maxSeqAhead).UnixMicro()); seq > limit {
		return "seq: " + strconv.FormatUint(seq, 10) + " is more than " + maxSeqAhead.String() + " ahead of the service's clock"
	}
	return ""
}

package rule

import "github.com/tollgate-rl/tollgate/shared/algo"

// Params returns the parameters of window w of rule r for caller key and tier, resolved
// as Apply resolves them (override > tier > the rule's own windows). The filter reports a
// bucket long after the request that touched it, possibly under a newer rule set: the
// rule id, the tier and the key are what identify the bucket, and the current rule set
// says what they mean now.
func (r *Rule) Params(key, tier string, w int) (algo.Params, bool) {
	windows := r.Windows
	if o := r.overrideFor(key); o >= 0 {
		windows = r.Overrides[o].Windows
	} else if tier != "" {
		if t, ok := r.Tiers[tier]; ok {
			windows = t
		}
	}
	if w < 0 || w >= len(windows) {
		return algo.Params{}, false
	}
	return windows[w], true
}

package rule

import (
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/header"
)

// PolicyName is the name of window p of rule id in the RateLimit headers:
// header.PolicyName's "<id>-<length>" ("api-1m"), except for a calendar window, which
// is named after its period and, when not UTC, its offset ("plan-month",
// "quota-day+05:30"): its length is not one duration.
func PolicyName(id string, p algo.Params) string {
	per, off, ok := p.Calendar()
	if !ok {
		return header.PolicyName(id, p.WindowUs)
	}
	if off == 0 {
		return id + "-" + per.String()
	}
	return id + "-" + per.String() + algo.FormatOffset(off)
}

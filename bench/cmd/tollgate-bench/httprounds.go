package main

import (
	"cmp"
	"fmt"
	"log"
	"slices"
	"strings"

	"github.com/tollgate-rl/tollgate/bench/perf"
)

// httpRounds is how many interleaved rounds the gateway-host comparison runs.
const httpRounds = 3

// httpRound is one round of the gateway-host comparison: pass-through, floor module and
// filter, each a full run (warm-up and measured time) on a fresh host.
type httpRound struct{ pass, floor, tollgate perf.LoadResult }

// share is the filter's requests/s as a fraction of the pass-through's in the round.
func (h httpRound) share() float64 { return ratio(h.tollgate.ChecksPerSec, h.pass.ChecksPerSec) }

// runHTTPRounds runs the gateway-host comparison in interleaved rounds, each starting
// with a different module, and gives the table the median round (by the filter's share).
// One run of each is not enough on a shared machine: a run's requests/s follows what
// else loads the 2 cores during its 17 s, and the filter's sync costs the same CPU per
// second however many requests go through, so a slow stretch weighs more on the filter.
func (r *report) runHTTPRounds(st *perf.Stack, o perf.LoadOptions, logger *log.Logger) error {
	kinds := []struct {
		name string
		kind perf.HTTPKind
	}{{"pass-through", perf.HTTPPassThrough}, {"floor", perf.HTTPFloor}, {"tollgate", perf.HTTPTollgate}}
	for i := range httpRounds {
		var rd httpRound
		dst := []*perf.LoadResult{&rd.pass, &rd.floor, &rd.tollgate}
		for j := range kinds {
			k := (i + j) % len(kinds)
			logger.Printf("load: http %s, round %d of %d", kinds[k].name, i+1, httpRounds)
			res, err := st.RunHTTP(o, kinds[k].kind, loadLimit)
			if err != nil {
				return fmt.Errorf("http %s, round %d: %w", kinds[k].name, i+1, err)
			}
			*dst[k] = res
		}
		r.httpRounds = append(r.httpRounds, rd)
	}
	med := r.httpMedian()
	r.loads["http pass-through"], r.loads["http floor"], r.loads["http tollgate"] = med.pass, med.floor, med.tollgate
	return nil
}

// httpMedian is the round whose filter share is the median of the rounds'.
func (r *report) httpMedian() httpRound {
	rs := slices.Clone(r.httpRounds)
	if len(rs) == 0 {
		return httpRound{}
	}
	slices.SortFunc(rs, func(a, b httpRound) int { return cmp.Compare(a.share(), b.share()) })
	return rs[len(rs)/2]
}

// httpRoundsNote lists every round's filter and floor shares, in the order they ran.
func (r *report) httpRoundsNote() string {
	if len(r.httpRounds) < 2 {
		return ""
	}
	var f, fl []string
	for _, rd := range r.httpRounds {
		f = append(f, fmt.Sprintf("%.0f", 100*rd.share()))
		fl = append(fl, fmt.Sprintf("%.0f", 100*ratio(rd.floor.ChecksPerSec, rd.pass.ChecksPerSec)))
	}
	return fmt.Sprintf("; median of %d interleaved rounds: the filter %s %%, the floor module %s %%",
		len(r.httpRounds), strings.Join(f, ", "), strings.Join(fl, ", "))
}

package nativehost_test

import (
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
)

// A key held at 10× its limit over four gateways of two workers for 60 simulated
// seconds: the gateways decide on rate leases (their shares of the refill, RATIONALE.md
// §3, keys at their limit), and the fleet stays within the bound §3 derives for them:
// over any interval of length T at most C + R·T permits (C the capacity, R the refill
// rate), plus what the cold-start allowances admitted before the first reports (C/20 at
// most); the overlap term of a shrinking share lasts a round trip, which callouts
// answered at once here do not have. Every 1 s interval and the whole run are checked. Requests held for an acquire
// stay below 1 % of the requests, and the fleet admits at least 90 % of what one
// perfect bucket admits (75 % when a gateway dies: its share stays reserved until its
// lease epoch is reclaimed, up to two epochs, 40 s). Traffic spread evenly, skewed to
// one gateway, and with a gateway that dies.
func TestRateLeaseFleetBound(t *testing.T) {
	for _, c := range []struct {
		name   string
		rule   string
		params algo.Params
		skew   bool // gateway 0 takes 70 % of the requests
		dieAt  int  // ms after which gateway 3 stops (0: never)
		quiet  bool // in every 2 s, 0.9 s without requests (the stocks fill), then 300 at once
		// least share of a perfect bucket's admissions the fleet reaches (per cent)
		least int
	}{
		{name: "gcra", rule: `"algorithm":"gcra","limit":100,"window":"1s"`, params: algo.Params{Kind: algo.GCRA, Limit: 100, WindowUs: 1_000_000}, least: 90},
		{name: "token_bucket_burst_200", rule: `"algorithm":"token_bucket","limit":100,"window":"1s","burst":200`, params: algo.Params{Kind: algo.TokenBucket, Limit: 100, WindowUs: 1_000_000, Burst: 200}, least: 90},
		{name: "gcra_skewed", rule: `"algorithm":"gcra","limit":100,"window":"1s"`, params: algo.Params{Kind: algo.GCRA, Limit: 100, WindowUs: 1_000_000}, skew: true, least: 90},
		{name: "gcra_quiet_then_bursts", rule: `"algorithm":"gcra","limit":100,"window":"1s"`, params: algo.Params{Kind: algo.GCRA, Limit: 100, WindowUs: 1_000_000}, quiet: true, least: 50},
		{name: "gcra_gateway_dies", rule: `"algorithm":"gcra","limit":100,"window":"1s"`, params: algo.Params{Kind: algo.GCRA, Limit: 100, WindowUs: 1_000_000}, dieAt: 20_000, least: 75},
	} {
		t.Run(c.name, func(t *testing.T) {
			const gateways, workers, runMs, perMs = 4, 2, 60_000, 1 // 1,000 requests/s: 10× the limit
			f := newFleetSync(t, gateways, workers, `"expected_nodes":4`, `[{"id":"api",`+c.rule+`}]`)
			f.svc.NoPenalty = true
			f.svc.Config.RateLeases = true // the Go model's (off in the service: lease.SyncConfig.RateLeases)
			f.settle()
			rng := rand.New(rand.NewPCG(uint64(len(c.name)), 3))
			var at []int64 // admission times, ms from the start
			requests := int64(0)
			acq0 := f.metric("tollgate.acquires")
			for ms := 0; ms < runMs; ms++ {
				live := gateways
				if c.dieAt > 0 && ms >= c.dieAt {
					live = gateways - 1
				}
				n := perMs
				if c.quiet && ms%2000 == 0 {
					n = 300 // the quiet ends with a burst
				}
				for range n {
					if c.quiet && ms%2000 >= 1100 {
						break
					}
					g := rng.IntN(live)
					if c.skew && rng.IntN(10) < 7 {
						g = 0
					}
					requests++
					if f.send(g, rng.IntN(workers), "hot").Admitted() {
						at = append(at, int64(ms))
					}
				}
				// The clock moves on; a dead gateway's workers no longer tick.
				f.now += 1000
				for g, h := range f.gws {
					if c.dieAt > 0 && ms >= c.dieAt && g == gateways-1 {
						continue
					}
					for w := range h.Workers() {
						h.Tick(w)
					}
				}
				f.deliver()
			}
			acquires := f.metric("tollgate.acquires") - acq0
			C, R := c.params.Capacity(), float64(c.params.Limit) // R per second
			cold := C / 20
			// Every interval [t, t+w) of 100 ms and of 1 s: at most C + R·w + cold.
			most := func(w int64) int {
				worst, j := 0, 0
				for i := range at {
					for at[i]-at[j] >= w {
						j++
					}
					worst = max(worst, i-j+1)
				}
				return worst
			}
			perfect := float64(C) + R*runMs/1000
			t.Logf("%s: %d of %d admitted over 60 s (a perfect bucket at 10×: %.0f, bound %.0f); most in any 100 ms: %d (bound %.0f), in any 1 s: %d (bound %.0f); %d acquires (%.2f %% of requests)",
				c.name, len(at), requests, perfect, perfect+float64(cold), most(100), float64(C)+R/10+float64(cold), most(1000), float64(C)+R+float64(cold), acquires, 100*float64(acquires)/float64(requests))
			for _, w := range []int64{100, 1000} {
				if b := float64(C) + R*float64(w)/1000 + float64(cold); float64(most(w)) > b {
					t.Errorf("%d admitted within %d ms, above the bound C + R·%d ms + C/20 = %.0f", most(w), w, w, b)
				}
			}
			if float64(len(at)) > perfect+float64(cold) {
				t.Errorf("%d admitted over 60 s, above the bound C + R·T + C/20 = %.0f", len(at), perfect+float64(cold))
			}
			if float64(len(at)) < float64(c.least)/100*perfect {
				t.Errorf("%d admitted over 60 s, below %d %% of a perfect bucket's %.0f", len(at), c.least, perfect)
			}
			if 100*acquires > requests {
				t.Errorf("%d acquires for %d requests: more than 1 %% of the requests held", acquires, requests)
			}
		})
	}
}

// A gateway decides on its rate lease alone: at 20× the limit one gateway refuses
// locally with the wait its accrual gives (at most one permit's time, 1 ms at 1,000/s),
// reports about once a second instead of acquiring when its lease runs dry, and admits
// the limit.
func TestRateLeaseDecidesLocally(t *testing.T) {
	f := newFleet(t, 1, 2, `[{"id":"api","algorithm":"gcra","limit":1000,"window":"1s"}]`)
	f.svc.NoPenalty = true
	f.svc.Config.RateLeases = true // the Go model's (off in the service: lease.SyncConfig.RateLeases)
	f.tick(100)
	admitted, refusedLong := 0, 0
	var batches0, acq0 int64
	for ms := 0; ms < 5000; ms++ {
		if ms == 2000 {
			batches0, acq0 = f.svc.Deltas, f.gws[0].Metric("tollgate.acquires")
		}
		for i := range 20 {
			s := f.send(0, i%2, "hot")
			if s.Admitted() {
				admitted++
			} else if ra, _ := strconv.Atoi(s.Header("retry-after")); ra > 1 {
				refusedLong++
			}
		}
		f.tick(1)
	}
	acquires := f.gws[0].Metric("tollgate.acquires") - acq0
	deltas := f.svc.Deltas - batches0
	t.Logf("5 s at 20x the limit: %d admitted; in the last 3 s %d acquires and %d deltas; %d refusals with Retry-After above 1 s", admitted, acquires, deltas, refusedLong)
	if admitted < 5600 || admitted > 6000+lease.ColdFraction {
		t.Errorf("%d admitted in 5 s, want about 6,000 (capacity 1,000 + 5,000 refill)", admitted)
	}
	if deltas > 10 {
		t.Errorf("%d deltas reported in 3 s at the limit, want about one a second", deltas)
	}
	if acquires > 0 {
		t.Errorf("%d acquires in the last 3 s, want none: the rate lease decides", acquires)
	}
	if refusedLong > 0 {
		t.Errorf("%d refusals with a Retry-After above 1 s; the rate lease's next permit is 1 ms away", refusedLong)
	}
}

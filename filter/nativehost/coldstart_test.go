package nativehost_test

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/nativehost"
)

// settle runs the fleet's syncs until every gateway trusts the fleet size the service
// counts (lease.FleetSettleUs, 3 s): cold-start allowances are sized by it.
func (f *fleet) settle() {
	for range 35 {
		f.tick(100)
	}
}

// burst sends n first requests of key at once, spread over every gateway and worker in
// an order picked by rnd, before any callout is answered; then the service answers and
// the workers tick (every 5 ms, the tick period while requests wait) until every
// request is decided. It returns the admitted and refused counts.
func (f *fleet) burst(rnd *rand.Rand, key string, n int) (admitted, refused int) {
	f.t.Helper()
	type lane struct{ g, w int }
	var lanes []lane
	for g, h := range f.gws {
		for w := range h.Workers() {
			lanes = append(lanes, lane{g, w})
		}
	}
	streams := make([]*nativehost.Stream, 0, n)
	for i := 0; i < n; i++ {
		l := lanes[rnd.IntN(len(lanes))]
		streams = append(streams, f.gws[l.g].Request(l.w, [][2]string{{":method", "GET"}, {":path", "/api"}, {":authority", "a"}, {"x-api-key", key}}, nil))
	}
	for round := 0; ; round++ {
		pending := 0
		for _, s := range streams {
			if !s.Decided {
				pending++
			}
		}
		if pending == 0 {
			break
		}
		if round == 400 {
			f.t.Fatalf("%d of %d requests still paused after 2 s of answered callouts", pending, n)
		}
		f.deliver()
		f.tick(5)
	}
	for _, s := range streams {
		if s.Admitted() {
			admitted++
		} else {
			refused++
			if s.Status() != 429 || s.Header("x-ratelimit-policy") == "degraded" {
				f.t.Fatalf("a first request answered %d (policy %q), want 200 or 429", s.Status(), s.Header("x-ratelimit-policy"))
			}
		}
	}
	return admitted, refused
}

// TestColdStartBurstAdmitsTheLimit: a fresh key of limit L meets N concurrent first
// requests spread over 1 and 4 gateways of 2 workers, N = L/2, L and 4L, 20 times each
// (a new key and a new order each time). A perfect limiter admits min(N, L); the fleet
// admits that within the cold-start bounds (RATIONALE.md §3): at most the gateways'
// allowances, floor(L / (20·gateways)) each, above it, and at most the leases granted
// beyond what waited, ceil(L / (4·gateways)) per gateway, below it. Limits of 100 have allowances on 1 and 4
// gateways (5 and 1 each); 10 and 5 have none: their first requests wait for shared
// acquires (5 concurrent first requests of a limit of 5 through one gateway admitted 2
// when each request acquired on its own).
func TestColdStartBurstAdmitsTheLimit(t *testing.T) {
	const runs = 20
	for _, gws := range []int{1, 4} {
		for _, limit := range []int{5, 10, 100} {
			for _, n := range []int{limit / 2, limit, 4 * limit} {
				t.Run(fmt.Sprintf("%d_gateways/limit_%d/%d_requests", gws, limit, n), func(t *testing.T) {
					f := newFleet(t, gws, 2, `[{"id":"api","limit":`+strconv.Itoa(limit)+`,"window":"1h"}]`)
					f.svc.NoPenalty = true
					f.settle()
					over := gws * (limit / (20 * gws))
					under := gws * ((limit + 4*gws - 1) / (4 * gws))
					want := min(n, limit)
					rnd := rand.New(rand.NewPCG(uint64(gws), uint64(n)))
					lo, hi := n, 0
					for run := range runs {
						admitted, _ := f.burst(rnd, "k"+strconv.Itoa(run), n)
						lo, hi = min(lo, admitted), max(hi, admitted)
						if admitted > want+over || admitted < want-under {
							t.Errorf("run %d: admitted %d, want %d, at most %d more and %d fewer (records: %s)", run, admitted, want, over, under, f.records("k"+strconv.Itoa(run)))
						}
					}
					t.Logf("admitted %d..%d of %d (perfect %d, bounds +%d −%d); over 20 runs: acquires %d, shared %d, cold admitted %d", lo, hi, n, want, over, under,
						f.metric("tollgate.acquires"), f.metric("tollgate.acquires_shared"), f.metric("tollgate.requests_cold_admitted"))
				})
			}
		}
	}
}

// metric sums a counter over the fleet's gateways.
func (f *fleet) metric(name string) int64 {
	var n int64
	for _, h := range f.gws {
		n += h.Metric(name)
	}
	return n
}

// TestColdStartFleetOfSixteen: 16 gateways of 2 workers, 200 fresh keys of limit 100,
// each hit by 48 concurrent first requests spread over the fleet. One perfect limiter
// refuses none; the fleet refuses under 1 % and admits no key beyond its limit + 5 %.
func TestColdStartFleetOfSixteen(t *testing.T) {
	const (
		gateways = 16
		keys     = 200
		perKey   = 48
		limit    = 100
	)
	f := newFleet(t, gateways, 2, `[{"id":"api","limit":100,"window":"1m"}]`)
	f.svc.NoPenalty = true
	f.settle()
	rnd := rand.New(rand.NewPCG(16, 48))
	refused, worst := 0, 0
	for k := range keys {
		admitted, r := f.burst(rnd, "key"+strconv.Itoa(k), perKey)
		refused += r
		worst = max(worst, admitted)
	}
	t.Logf("%d of %d refused (%.2f %%); acquires %d, shared %d, cold admitted %d", refused, keys*perKey,
		100*float64(refused)/float64(keys*perKey), f.metric("tollgate.acquires"), f.metric("tollgate.acquires_shared"), f.metric("tollgate.requests_cold_admitted"))
	if refused*100 >= keys*perKey {
		t.Errorf("%d of %d first requests refused, want < 1 %%", refused, keys*perKey)
	}
	if worst > limit+limit/20 {
		t.Errorf("a key admitted %d, beyond its limit %d + 5 %%", worst, limit)
	}
}

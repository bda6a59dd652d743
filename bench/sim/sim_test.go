package sim

import (
	"errors"
	"math"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

func TestDeterministic(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
	}{
		{"steady", Config{Traffic: Steady}},
		{"bursty lossy", Config{Traffic: Bursty, Loss: 0.05, Latency: Latency{time.Millisecond, 10 * time.Millisecond}}},
		{"zipf sharded", Config{Traffic: Zipf, Keys: 10000, Shards: 3, Workers: 3}},
		{"adversarial outage", Config{Traffic: Adversarial, Outage: Window{time.Second, time.Second}}},
		{"ninety weighted", Config{Traffic: Ninety, Gateways: 3, Weights: []float64{1, 2, 0}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Duration, cfg.Seed, cfg.PerKey, cfg.SeriesStep = 3*time.Second, 7, true, 100*time.Millisecond
			a, b := Run(cfg), Run(cfg)
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("same seed, different results:\n%+v\n%+v", summary(a), summary(b))
			}
			if a.Requests == 0 || a.Syncs == 0 {
				t.Fatalf("nothing simulated: %+v", summary(a))
			}
			cfg.Seed++
			if c := Run(cfg); c.Requests == a.Requests && c.Admitted == a.Admitted && c.Syncs == a.Syncs {
				t.Fatalf("seeds 7 and 8 gave the same run: %+v", summary(a))
			}
		})
	}
}

// TestSkewDoesNotMatter: gateways never compare their clock with the service's
// (RATIONALE §4), so shifting each gateway's clock by up to ten minutes must change no
// decision at all.
func TestSkewDoesNotMatter(t *testing.T) {
	for _, tr := range []Traffic{Ninety, Adversarial, Bursty} {
		t.Run(tr.String(), func(t *testing.T) {
			cfg := Config{Traffic: tr, Duration: 5 * time.Second, Seed: 3, Loss: 0.05,
				Outage: Window{2 * time.Second, time.Second}, PerKey: true}
			a := Run(cfg)
			cfg.Skew = 10 * time.Minute
			b := Run(cfg)
			a.Config, b.Config = Config{}, Config{}
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("skew changed the run:\n%+v\n%+v", summary(a), summary(b))
			}
		})
	}
}

// TestSingleGateway: one gateway is the whole fleet, so it should admit what one perfect
// limiter admits. It cannot match it request for request — permits that refill at the
// service reach the gateway as lease at its next sync — but per key:
//   - it never falls behind by more than the refill of one interval plus one round trip;
//   - with one worker it never exceeds the limit over any window; with several, a worker
//     whose record is still cold (no reply yet) decides alone and its admissions reach
//     the service after another worker's reply computed the overdraft: the excess is
//     bounded by those cold admissions (RATIONALE §3, "cold starts").
func TestSingleGateway(t *testing.T) {
	for _, workers := range []int{1, 2, 4} {
		t.Run(strconv.Itoa(workers)+" workers", func(t *testing.T) {
			cfg := Config{Traffic: Adversarial, Gateways: 1, Workers: workers, Keys: 10,
				Duration: 60 * time.Second, Seed: 1, NoPenalty: true, PerKey: true,
				Latency: Latency{Base: time.Millisecond}}
			r := Run(cfg)
			c := r.Config
			rtt := 2 * c.Latency.Base
			lag := int64(math.Ceil(c.limitRate() * (c.Interval + rtt).Seconds()))
			for k, kr := range r.Keys {
				behind := kr.RefAdmitted - kr.Admitted
				if behind > lag || behind < -kr.ColdAdmitted {
					t.Errorf("key %d: admitted %d, reference %d: want between reference - %d (one interval and a round trip of refill) and reference + %d (cold admissions)",
						k, kr.Admitted, kr.RefAdmitted, lag, kr.ColdAdmitted)
				}
				limit := kr.ColdAdmitted
				if workers == 1 {
					limit = 0
				}
				if kr.OverAdmission > limit {
					t.Errorf("key %d: over-admission %d permits, want ≤ %d (cold admissions %d)", k, kr.OverAdmission, limit, kr.ColdAdmitted)
				}
			}
			t.Logf("admitted %d, reference %d, worst over-admission %d permits", r.Admitted, r.RefAdmitted, r.OverAdmission)
		})
	}
}

// TestAdversarialFleetBound: RATIONALE §3 bounds a healthy fleet's over-admission by the
// overdraft slices, Σ_n floor(G/nodes) ≤ G, where G, the unreserved global pool, never
// exceeds the bucket's capacity. The fleet size is configured (sync.expected_nodes), as
// §2's cold start assumes.
func TestAdversarialFleetBound(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
	}{
		{"penalties", Config{}},
		{"no penalties", Config{NoPenalty: true}},
		{"lossy jittered", Config{NoPenalty: true, Loss: 0.02, Latency: Latency{time.Millisecond, 5 * time.Millisecond}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Traffic, cfg.Gateways, cfg.ExpectedNodes = Adversarial, 4, 4
			cfg.Keys, cfg.Duration, cfg.Seed = 10, 60*time.Second, 1
			r := Run(cfg)
			nodes := int64(r.Config.Gateways)
			capacity := r.Config.Params.Capacity()
			bound := nodes * (capacity / nodes)
			if r.OverAdmission > bound {
				t.Fatalf("over-admission %d permits (key %d at %v), want ≤ Σ_n floor(G/nodes) = %d with G ≤ capacity %d",
					r.OverAdmission, r.WorstKey, r.WorstAt, bound, capacity)
			}
			t.Logf("over-admission %d permits = %.1f%% of the limit (bound %d); admitted %d, reference %d",
				r.OverAdmission, r.OverAdmissionPct, bound, r.Admitted, r.RefAdmitted)
		})
	}
}

// TestNinetyPercentClient: a client at 90% of its limit is one a perfect limiter almost
// never rejects; the fleet must not reject it either (RATIONALE §3, false rejections).
func TestNinetyPercentClient(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
	}{
		{"4 gateways", Config{Gateways: 4}},
		{"4 gateways lossy", Config{Gateways: 4, Loss: 0.02, Latency: Latency{time.Millisecond, 5 * time.Millisecond}}},
		{"8 gateways 4 workers", Config{Gateways: 8, Workers: 4}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Traffic, cfg.Keys, cfg.Duration, cfg.Seed = Ninety, 10, 60*time.Second, 1
			r := Run(cfg)
			if r.RefAdmitted < r.Requests*99/100 {
				t.Fatalf("the reference rejected %d of %d requests: not a 90%% client", r.Requests-r.RefAdmitted, r.Requests)
			}
			if r.FalseRejectionPct >= 0.1 {
				t.Fatalf("false rejections %.3f%% (%d of %d), want < 0.1%%; by cause %+v", r.FalseRejectionPct, r.FalseRejections, r.RefAdmitted, r.FalseBy)
			}
			t.Logf("false rejections %.4f%% (%d of %d)", r.FalseRejectionPct, r.FalseRejections, r.RefAdmitted)
		})
	}
}

// TestOutage: while the service answers 503, the breaker opens after BreakerFailures
// failures and every decision is degraded (local, full limit per gateway); after the
// outage the half-open probe closes the breaker and decisions stop being degraded
// within one breaker period, two ticks and three round trips (the probe, and the
// first sync of each bucket a degraded decision touched).
func TestOutage(t *testing.T) {
	cases := []struct {
		name    string
		traffic Traffic
	}{
		{"ninety", Ninety},
		{"adversarial", Adversarial},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := Window{Start: 8 * time.Second, Dur: 4 * time.Second}
			cfg := Config{Traffic: tc.traffic, Gateways: 4, ExpectedNodes: 4, Keys: 10, Duration: 20 * time.Second,
				Seed: 1, NoPenalty: true, Latency: Latency{Base: time.Millisecond}, Outage: out, SeriesStep: 100 * time.Millisecond}
			r := Run(cfg)
			c := r.Config
			end := out.Start + out.Dur
			rtt := 2 * c.Latency.Base
			recovered := end + c.BreakerOpen + 2*c.Interval + 3*rtt
			if r.Degraded == 0 || r.FirstDegraded < out.Start || r.FirstDegraded > out.Start+c.LeaseTTL+c.Interval {
				t.Fatalf("%d degraded decisions, first at %v: want some, from %v to %v", r.Degraded, r.FirstDegraded, out.Start, out.Start+c.LeaseTTL+c.Interval)
			}
			if r.LastDegraded > recovered {
				t.Fatalf("last degraded decision at %v, want ≤ %v (outage end %v + breaker %v + 2 ticks + 3 round trips)", r.LastDegraded, recovered, end, c.BreakerOpen)
			}
			if r.BreakerOpens < int64(c.Gateways*c.Workers) {
				t.Fatalf("%d breaker openings, want at least one per worker (%d)", r.BreakerOpens, c.Gateways*c.Workers)
			}
			for _, st := range r.Series {
				// A breaker opens within BreakerFailures ticks of the outage's start.
				inside := st.Start >= out.Start+time.Duration(c.BreakerFailures+1)*c.Interval && st.Start+c.SeriesStep <= end
				if inside && st.Degraded != st.Requests {
					t.Fatalf("step at %v: %d of %d decisions degraded, want all", st.Start, st.Degraded, st.Requests)
				}
			}

			// Degraded, every gateway decides alone with the full limit. Its local state
			// follows only its own admissions, so it enters the outage nearly full while
			// the global bucket may be empty: over the degraded span T each admits at most
			// C + r·T, the fleet N(C + r·T), of which one limiter allows r·T beyond
			// what it held; plus the healthy bound (§3) for the rest of the run.
			n := int64(c.Gateways)
			capacity := c.Params.Capacity()
			span := (r.LastDegraded - r.FirstDegraded).Seconds()
			perGateway := float64(capacity) + c.limitRate()*span
			bound := int64(float64(n)*perGateway-c.limitRate()*span) + n*(capacity/n)
			rationale := int64(float64(n-1) * perGateway)
			if r.OverAdmission > bound {
				t.Fatalf("over-admission %d permits, want ≤ %d", r.OverAdmission, bound)
			}
			after := falseAfter(r.Series, recovered)
			t.Logf("degraded %d decisions from %v to %v; over-admission %d permits (bound %d; RATIONALE §3's (nodes-1)×limit: %d); false rejections after %v: %.1f%%",
				r.Degraded, r.FirstDegraded, r.LastDegraded, r.OverAdmission, bound, rationale, recovered, after)
		})
	}
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
	}{
		{"weights for other gateways", Config{Gateways: 2, Weights: []float64{1}}},
		{"loss above one", Config{Loss: 1.5}},
		{"lease ttl below interval", Config{LeaseTTL: 10 * time.Millisecond}},
		{"sliding window log", Config{Params: algo.Params{Kind: algo.SlidingWindowLog, Limit: 10, WindowUs: 1_000_000}}},
		{"zipf exponent", Config{Traffic: Zipf, ZipfS: 0.5}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cfg.WithDefaults()
			if err := c.Validate(); !errors.Is(err, ErrConfig) {
				t.Fatalf("Validate() = %v, want ErrConfig", err)
			}
		})
	}
	c := Config{}.WithDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
}

func TestParse(t *testing.T) {
	if l, err := ParseLatency("1ms+3ms"); err != nil || l != (Latency{time.Millisecond, 3 * time.Millisecond}) {
		t.Errorf("ParseLatency(1ms+3ms) = %v, %v", l, err)
	}
	if _, err := ParseLatency("-1ms"); err == nil {
		t.Error("ParseLatency(-1ms) accepted")
	}
	if w, err := ParseWindow("20s:5s"); err != nil || w != (Window{20 * time.Second, 5 * time.Second}) {
		t.Errorf("ParseWindow(20s:5s) = %v, %v", w, err)
	}
	if _, err := ParseWindow("20s"); err == nil {
		t.Error("ParseWindow(20s) accepted")
	}
	for i, n := range trafficNames {
		if tr, err := ParseTraffic(n); err != nil || tr != Traffic(i) {
			t.Errorf("ParseTraffic(%q) = %v, %v", n, tr, err)
		}
	}
	if _, err := ParseTraffic("flood"); err == nil {
		t.Error("ParseTraffic(flood) accepted")
	}
}

// falseAfter is the false-rejection percentage of the steps starting at or after from.
func falseAfter(series []Step, from time.Duration) float64 {
	var ref, f int64
	for _, st := range series {
		if st.Start >= from {
			ref += st.RefAdmitted
			f += st.FalseRejections
		}
	}
	if ref == 0 {
		return 0
	}
	return 100 * float64(f) / float64(ref)
}

func summary(r Result) Result {
	r.Keys, r.Series = nil, nil
	return r
}

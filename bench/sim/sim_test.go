package sim

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

// The bounds below sit a few points above what the simulation measures (the runs are
// deterministic: the same seed gives the same numbers), so a change that makes the
// protocol worse fails here. BENCHMARKS.md §8 has the full sweeps.

func TestDeterministic(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
	}{
		{"steady", Config{Traffic: Steady}},
		{"bursty lossy", Config{Traffic: Bursty, Loss: 0.05, Latency: Latency{time.Millisecond, 10 * time.Millisecond}}},
		{"zipf", Config{Traffic: Zipf, Keys: 2000, Workers: 3}},
		{"adversarial outage", Config{Traffic: Adversarial, Outage: Window{time.Second, time.Second}}},
		{"mixed spread", Config{Traffic: Mixed, Keys: 500, Gateways: 6, Spread: 2}},
		{"realistic", Config{Traffic: Realistic, Keys: 5000, Gateways: 6}},
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
			c := Run(cfg)
			c.Config = a.Config
			if reflect.DeepEqual(summary(c), summary(a)) {
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

// TestOverAdmission: clients at 10 × their limit over several gateways and workers, with
// progressive penalties off so that only the leases and acquires bound them: the fleet
// admits at most two permits more than one perfect bucket over any window (measured:
// 0–2), whatever the fleet, the latency or the losses. The cold-start allowances add
// nothing here: a valid lease that runs dry acquires instead of spending them
// (RATIONALE.md §2, step 5), and the keys' first requests find their buckets full.
func TestOverAdmission(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
	}{
		{"1 gateway 4 workers", Config{Gateways: 1, Workers: 4}},
		{"4 gateways", Config{Gateways: 4}},
		{"16 gateways", Config{Gateways: 16}},
		{"lossy jittered", Config{Gateways: 4, Loss: 0.02, Latency: Latency{time.Millisecond, 5 * time.Millisecond}}},
		{"fixed window", Config{Gateways: 4, Params: algo.Params{Kind: algo.FixedWindow, Limit: 100, WindowUs: 1_000_000}}},
		{"gcra", Config{Gateways: 4, Params: algo.Params{Kind: algo.GCRA, Limit: 100, WindowUs: 1_000_000, Burst: 20}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Traffic, cfg.NoPenalty, cfg.Keys, cfg.Duration, cfg.Seed = Adversarial, true, 10, 30*time.Second, 1
			r := Run(cfg)
			if r.OverAdmission > 2 {
				t.Fatalf("over-admission %d permits (key %d at %v), want ≤ 2", r.OverAdmission, r.WorstKey, r.WorstAt)
			}
			if r.Admitted < r.RefAdmitted*97/100 {
				t.Fatalf("admitted %d, a perfect limiter %d: more than 3%% of the permits were never handed out", r.Admitted, r.RefAdmitted)
			}
			t.Logf("over-admission %d permits; admitted %d, reference %d; %.0f acquires/s", r.OverAdmission, r.Admitted, r.RefAdmitted, r.ChecksPerSec)
		})
	}
}

// TestNinetyPercentClient: a client at 90% of its limit is one a perfect limiter almost
// never rejects; the fleet must not reject it either: below 0.1 %. A lease runs dry
// while the other gateways hold the rest of the bucket only when the leases reserve it
// all: before leases by demand left half of it unreserved (lease.FleetLeaseKeep), 16
// gateways refused 0.15 % (RATIONALE.md §2, "Grants").
func TestNinetyPercentClient(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
	}{
		{"4 gateways", Config{Gateways: 4}},
		{"4 gateways lossy", Config{Gateways: 4, Loss: 0.02, Latency: Latency{time.Millisecond, 5 * time.Millisecond}}},
		{"8 gateways 4 workers", Config{Gateways: 8, Workers: 4}},
		// The regime of BENCHMARKS.md §11.
		{"16 gateways", Config{Gateways: 16, Keys: 100, Duration: 10 * time.Second}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Traffic, cfg.Seed = Ninety, 1
			if cfg.Keys == 0 {
				cfg.Keys, cfg.Duration = 10, 30*time.Second
			}
			r := Run(cfg)
			if r.RefAdmitted < r.Requests*99/100 {
				t.Fatalf("the reference rejected %d of %d requests: not a 90%% client", r.Requests-r.RefAdmitted, r.Requests)
			}
			if r.FalseRejectionPct >= 0.1 {
				t.Fatalf("false rejections %.3f%% (%d of %d), want < 0.1%%; by cause %+v", r.FalseRejectionPct, r.FalseRejections, r.RefAdmitted, r.FalseBy)
			}
			t.Logf("false rejections %.4f%% (%d of %d); %d requests waited for the service (p99 %v)", r.FalseRejectionPct, r.FalseRejections, r.RefAdmitted, r.Waited, r.WaitP99)
		})
	}
}

// TestBurstyClient: a client bursting at 4× its limit for 200 ms a second stays within
// what one perfect bucket admits (80 requests a burst, capacity 100), so the fleet must
// refuse few of its requests: below 2 %. Each gateway's lease follows its share of the
// demand, and within a burst some gateways need more than their share while others
// need less: with leases reserving the whole bucket, 16 gateways refused 12.6 % of the
// requests (the bucket reserved by leases their gateways did not use); leaving half of
// it to acquires (lease.FleetLeaseKeep) brings it under 1 %.
func TestBurstyClient(t *testing.T) {
	for _, gws := range []int{4, 16} {
		t.Run(strconv.Itoa(gws)+" gateways", func(t *testing.T) {
			r := Run(Config{Traffic: Bursty, Gateways: gws, Keys: 20, Duration: 10 * time.Second, Seed: 1})
			if r.RefAdmitted < r.Requests*99/100 {
				t.Fatalf("the reference rejected %d of %d requests: not a client within its limit", r.Requests-r.RefAdmitted, r.Requests)
			}
			if r.FalseRejectionPct >= 2 {
				t.Fatalf("false rejections %.3f%% (%d of %d), want < 2%%; by cause %+v", r.FalseRejectionPct, r.FalseRejections, r.RefAdmitted, r.FalseBy)
			}
			t.Logf("false rejections %.4f%% (%d of %d); %d requests waited for the service (p99 %v)", r.FalseRejectionPct, r.FalseRejections, r.RefAdmitted, r.Waited, r.WaitP99)
		})
	}
}

// TestMeshScale: the mesh of RATIONALE §3 in small — a thousand keys over twenty
// gateways, each key through two of them, 1 % of the keys at ten times their limit: the
// state per key at the service does not depend on the number of gateways, the calm keys
// are not refused, nobody gets more than one perfect bucket, and every gateway sends
// one sync per interval (plus acquires), not one per worker.
func TestMeshScale(t *testing.T) {
	var state []float64
	for _, gws := range []int{2, 20} {
		t.Run(strconv.Itoa(gws)+" gateways", func(t *testing.T) {
			r := Run(Config{Traffic: Mixed, Keys: 1000, Gateways: gws, Spread: 2, Duration: 20 * time.Second, Seed: 2})
			if r.OverAdmissionPct > 2 {
				t.Errorf("over-admission %.2f%% (%d permits, key %d), want ≤ 2%%", r.OverAdmissionPct, r.OverAdmission, r.WorstKey)
			}
			if r.CalmFalsePct > 0.02 {
				t.Errorf("false rejections of calm keys %.4f%% (%d of %d), want ≤ 0.02%%; by cause %+v", r.CalmFalsePct, r.CalmFalse, r.CalmRefAdmitted, r.FalseBy)
			}
			if r.SyncsPerGateway > 10.5 {
				t.Errorf("%.2f syncs per gateway per second, want one per 100 ms interval", r.SyncsPerGateway)
			}
			state = append(state, r.StateBytes)
			t.Logf("over %.2f%%, calm false %.4f%%, %.2f syncs/gateway/s, %.0f acquires/s, %.0f deltas/s for %.0f requests/s, state %.1f B/key (max %.0f)",
				r.OverAdmissionPct, r.CalmFalsePct, r.SyncsPerGateway, r.ChecksPerSec, r.DeltasPerSec, float64(r.Requests)/r.Config.Duration.Seconds(), r.StateBytes, r.StateBytesMax)
		})
	}
	if len(state) == 2 && (state[1] > state[0]+2 || state[1] < state[0]-2) {
		t.Errorf("state per key %.1f B with 2 gateways, %.1f B with 20: it must not grow with the fleet", state[0], state[1])
	}
}

// TestOutage: while the service answers 503 every answer becomes degraded within a few
// intervals; after the outage answers stop being degraded within a breaker period and a
// few intervals; over-admission while degraded stays within RATIONALE §3's bound.
func TestOutage(t *testing.T) {
	for _, tr := range []Traffic{Ninety, Adversarial} {
		t.Run(tr.String(), func(t *testing.T) {
			out := Window{Start: 8 * time.Second, Dur: 4 * time.Second}
			cfg := Config{Traffic: tr, Gateways: 4, Keys: 10, Duration: 20 * time.Second, Seed: 1, NoPenalty: true,
				Latency: Latency{Base: time.Millisecond}, Outage: out, SeriesStep: 100 * time.Millisecond}
			r := Run(cfg)
			c := r.Config
			end := out.Start + out.Dur
			if r.Degraded == 0 || r.FirstDegraded < out.Start || r.FirstDegraded > out.Start+3*c.Interval {
				t.Fatalf("%d degraded answers, first at %v: want some, from %v to %v", r.Degraded, r.FirstDegraded, out.Start, out.Start+3*c.Interval)
			}
			recovered := end + c.BreakerOpen + 3*c.Interval
			if r.LastDegraded > recovered {
				t.Fatalf("last degraded answer at %v, want ≤ %v (outage end %v + breaker %v + 3 intervals)", r.LastDegraded, recovered, end, c.BreakerOpen)
			}
			for _, st := range r.Series {
				inside := st.Start >= out.Start+3*c.Interval && st.Start+c.SeriesStep <= end
				if inside && st.Degraded != st.Requests {
					t.Fatalf("step at %v: %d of %d answers degraded, want all", st.Start, st.Degraded, st.Requests)
				}
			}
			// Degraded, every gateway decides alone with the full limit: over the degraded
			// span T each admits at most C + r·T, the fleet N(C + r·T), of which one
			// limiter allows r·T. What was admitted degraded beyond the global bucket is
			// forgiven (FlagDegraded), so the service comes out of the outage with up to
			// one more capacity than a limiter that counted it.
			n := int64(c.Gateways)
			capacity := c.Params.Capacity()
			span := (r.LastDegraded - r.FirstDegraded).Seconds()
			perGateway := float64(capacity) + c.limitRate()*span
			bound := int64(float64(n)*perGateway-c.limitRate()*span) + capacity
			if r.OverAdmission > bound {
				t.Fatalf("over-admission %d permits, want ≤ %d", r.OverAdmission, bound)
			}
			t.Logf("degraded %d answers from %v to %v; over-admission %d permits (bound %d)", r.Degraded, r.FirstDegraded, r.LastDegraded, r.OverAdmission, bound)
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
		{"stale below interval", Config{Stale: 10 * time.Millisecond}},
		{"spread above gateways", Config{Gateways: 2, Spread: 3}},
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

func summary(r Result) Result {
	r.Keys, r.Series = nil, nil
	return r
}

// TestExplain: with Config.Explain every held request and every false rejection of a
// calm key is counted under one cause, and the causes read the gateways' records: a
// request finds no record on its gateway at most once per key and gateway.
func TestExplain(t *testing.T) {
	cfg := Config{Traffic: Bursty, Gateways: 16, Keys: 20, Duration: 5 * time.Second, Seed: 1, Explain: true}
	r := Run(cfg)
	var held, falses int64
	for cause, n := range r.Why {
		switch {
		case strings.HasPrefix(cause, "held: "):
			held += n
		case strings.HasPrefix(cause, "false "):
			falses += n
		default:
			t.Fatalf("cause %q counted %d times: neither held nor false", cause, n)
		}
	}
	if held != r.Waited || falses != r.CalmFalse {
		t.Fatalf("causes count %d held and %d false rejections, the run %d and %d: %v", held, falses, r.Waited, r.CalmFalse, r.Why)
	}
	if n := r.Why["held: no record on this gateway (first request there)"]; n > int64(cfg.Keys*cfg.Gateways) || n == 0 {
		t.Fatalf("%d held requests found no record, want 1..%d (one per key and gateway): %v", n, cfg.Keys*cfg.Gateways, r.Why)
	}
	if Run(Config{Traffic: Bursty, Gateways: 16, Keys: 20, Duration: 5 * time.Second, Seed: 1}).Why != nil {
		t.Fatal("Why filled without Explain")
	}
}

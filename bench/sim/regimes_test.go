package sim

import (
	"math"
	"testing"
	"time"
)

// TestRealisticTraffic checks the realistic generator against what its doc promises:
// requests in time order; no key sends before it is born, and about NewKeys of the keys
// seen are born during the run; sessions of BurstSize requests within BurstOn; key k's
// share of the requests follows (k+1)^-s; the total rate is Load × the limit rate ×
// Σ(k+1)^-s less the unborn keys' share; keys above their limit are not calm.
func TestRealisticTraffic(t *testing.T) {
	cfg := Config{Traffic: Realistic, Keys: 1000, Load: 4, BurstSize: 5, NewKeys: 0.5, Duration: 100 * time.Second, Seed: 9}.WithDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	src := newSource(&cfg)
	var (
		last     int64
		n        int64
		perKey   = make([]int64, cfg.Keys)
		first    = make([]int64, cfg.Keys)
		lastSeen = make([]int64, cfg.Keys)
	)
	for {
		at, key, gw, wk, ok := src.next()
		if !ok {
			break
		}
		if at < last {
			t.Fatalf("request at %d after one at %d", at, last)
		}
		if gw < 0 || gw >= cfg.Gateways || wk < 0 || wk >= cfg.Workers {
			t.Fatalf("gateway %d worker %d", gw, wk)
		}
		if at < src.birth(key) {
			t.Fatalf("key %d sent at %d, born at %d", key, at, src.birth(key))
		}
		if perKey[key] == 0 {
			first[key] = at
		}
		perKey[key]++
		lastSeen[key] = at
		last = at
		n++
	}
	// Total: sessions of the born keys; a key born at b sends over (end-b)/end of the run.
	var want float64
	end := float64(us(cfg.Duration))
	for k := range cfg.Keys {
		rate := cfg.Load * cfg.limitRate() * math.Pow(float64(k+1), -cfg.ZipfS)
		want += rate * cfg.Duration.Seconds() * (end - float64(src.birth(uint32(k)))) / end
	}
	if math.Abs(float64(n)-want) > 0.05*want {
		t.Errorf("%d requests, want about %.0f", n, want)
	}
	// Popularity: key 0 against key 9, (1/10)^-1.1 ≈ 12.6 times as many, when both were
	// born at the start.
	if src.birth(0) == 0 && src.birth(9) == 0 {
		if r := float64(perKey[0]) / float64(perKey[9]); r < 9 || r > 17 {
			t.Errorf("key 0 sent %d, key 9 %d: ratio %.1f, want about 12.6", perKey[0], perKey[9], r)
		}
	}
	// Births: about half the keys that sent anything were born during the run.
	var seen, born int
	for k := range cfg.Keys {
		if perKey[k] == 0 {
			continue
		}
		seen++
		if src.birth(uint32(k)) > 0 {
			born++
		}
	}
	if share := float64(born) / float64(seen); share < 0.3 || share > 0.7 {
		t.Errorf("%d of %d keys seen were born during the run", born, seen)
	}
	// Sessions: a tail key seen once sends BurstSize requests within BurstOn.
	var sessions int
	for k := cfg.Keys / 2; k < cfg.Keys; k++ {
		if perKey[k] == int64(cfg.BurstSize) {
			sessions++
			if d := lastSeen[k] - first[k]; d > us(cfg.BurstOn) {
				t.Errorf("key %d: one session over %d µs", k, d)
			}
		}
		if perKey[k]%int64(cfg.BurstSize) != 0 && lastSeen[k] < us(cfg.Duration-cfg.BurstOn) {
			t.Errorf("key %d sent %d requests, not whole sessions of %d", k, perKey[k], cfg.BurstSize)
		}
	}
	if sessions == 0 {
		t.Error("no tail key sent exactly one session")
	}
	// Calm: Load 4, s 1.1: keys 0 and 1 are above their limit (4, 1.87), key 2 (1.19)
	// too, key 3 (0.87) is within it.
	for k, want := range []bool{false, false, false, true, true} {
		if got := src.calm(uint32(k)); got != want {
			t.Errorf("calm(%d) = %v, want %v", k, got, want)
		}
	}
}

// TestTargetMet: a bound is met at or below it (strictly below for a strict one), and
// never by a run that simulated nothing.
func TestTargetMet(t *testing.T) {
	value := func(r Result) float64 { return r.CalmFalsePct }
	cases := []struct {
		name   string
		strict bool
		res    Result
		want   bool
	}{
		{"below", false, Result{Requests: 10, CalmFalsePct: 0.5}, true},
		{"at, not strict", false, Result{Requests: 10, CalmFalsePct: 1}, true},
		{"at, strict", true, Result{Requests: 10, CalmFalsePct: 1}, false},
		{"above", false, Result{Requests: 10, CalmFalsePct: 1.5}, false},
		{"nothing simulated", false, Result{}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tg := Target{Value: value, Bound: 1, Strict: c.strict}
			if got := tg.Met(c.res); got != c.want {
				t.Fatalf("Met = %v, want %v", got, c.want)
			}
		})
	}
}

// TestHeldPct counts the requests a gateway paused as a share of all.
func TestHeldPct(t *testing.T) {
	if got := HeldPct(Result{Requests: 400, Waited: 10}); got != 2.5 {
		t.Fatalf("HeldPct = %v, want 2.5", got)
	}
	if got := HeldPct(Result{}); got != 0 {
		t.Fatalf("HeldPct of nothing = %v", got)
	}
}

// TestRealisticRunHeldAndCalm runs a small realistic fleet: every key starts cold, so
// some requests are held for an acquire, the counts add up, and the per-key
// classification leaves the keys above their limit out of the calm counts.
func TestRealisticRunHeldAndCalm(t *testing.T) {
	r := Run(Config{Traffic: Realistic, Keys: 2000, Gateways: 4, Duration: 5 * time.Second, Seed: 4, PerKey: true})
	if r.Requests == 0 || r.Waited == 0 || r.Waited > r.Requests {
		t.Fatalf("%d requests, %d held", r.Requests, r.Waited)
	}
	if r.CalmRefAdmitted == 0 || r.CalmRefAdmitted >= r.RefAdmitted {
		t.Fatalf("calm keys' reference admissions %d of %d: the keys above their limit should not count", r.CalmRefAdmitted, r.RefAdmitted)
	}
	var sum int64
	for _, k := range r.Keys {
		sum += k.Requests
	}
	if sum != r.Requests {
		t.Fatalf("per-key requests %d, total %d", sum, r.Requests)
	}
}

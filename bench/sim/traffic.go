package sim

import (
	"math"
	"math/rand/v2"
	"sort"
)

// source generates the merged request stream of all keys. Independent Poisson processes
// of rates λ_k merge into one Poisson process of rate Σλ_k whose every arrival belongs
// to key k with probability λ_k/Σλ_k, so one exponential draw per request suffices
// whatever the number of keys. Bursty keys are the same stream thinned: an arrival
// counts only if its key is in an on phase.
//
// The source has random streams of its own, so a sweep over gateways, intervals or
// latency replays exactly the same requests at every point.
type source struct {
	kind     Traffic
	keys     int
	ratePerU float64 // candidate arrivals per µs
	t        float64 // µs
	end      int64
	rng      *rand.Rand // arrival times and keys
	route    *rand.Rand // gateway and worker choice
	zipf     *rand.Zipf
	on       int64 // Bursty: on phase, µs
	period   int64 // Bursty: on + off, µs
	seed     uint64
	cum      []float64 // cumulative gateway weights
	workers  int
	gateways int
	spread   int
	// Mixed: keys below adv are adversarial; an arrival is one of them with probability
	// advP.
	adv  int
	advP float64
}

func newSource(c *Config) *source {
	s := &source{
		kind:     c.Traffic,
		keys:     c.Keys,
		end:      us(c.Duration),
		rng:      rand.New(rand.NewPCG(c.Seed, 0x7472616666696321)),
		route:    rand.New(rand.NewPCG(c.Seed, 0x726f757465212121)),
		seed:     c.Seed,
		workers:  c.Workers,
		gateways: c.Gateways,
		spread:   c.Spread,
	}
	perKey := c.Load * c.limitRate() / 1e6 // mean arrivals per µs per key
	if c.Traffic == Mixed {
		s.adv = int(math.Round(c.AdversarialShare * float64(c.Keys)))
		advRate := 10 * c.limitRate() / 1e6 * float64(s.adv)
		calmRate := perKey * float64(c.Keys-s.adv)
		s.ratePerU = advRate + calmRate
		if s.ratePerU > 0 {
			s.advP = advRate / s.ratePerU
		}
	}
	switch c.Traffic {
	case Bursty:
		s.on, s.period = us(c.BurstOn), us(c.BurstOn)+us(c.BurstOff)
		perKey *= float64(s.period) / float64(s.on) // the same mean over the cycle
	case Zipf:
		s.zipf = rand.NewZipf(s.rng, c.ZipfS, 1, uint64(c.Keys-1))
	}
	if c.Traffic != Mixed {
		s.ratePerU = perKey * float64(c.Keys)
	}
	var sum float64
	for g := range c.Gateways {
		w := 1.0
		if c.Weights != nil {
			w = c.Weights[g]
		}
		sum += w
		s.cum = append(s.cum, sum)
	}
	if sum == 0 { // all weights zero: equal shares
		for g := range s.cum {
			s.cum[g] = float64(g + 1)
		}
	}
	return s
}

// next returns the next request: its time (µs from the start), key, gateway and worker;
// ok is false past the end of the run.
func (s *source) next() (t int64, key uint32, gw, wk int, ok bool) {
	if s.ratePerU <= 0 {
		return 0, 0, 0, 0, false
	}
	for {
		s.t += s.rng.ExpFloat64() / s.ratePerU
		if s.t >= float64(s.end) || math.IsInf(s.t, 0) {
			return 0, 0, 0, 0, false
		}
		t = int64(s.t)
		switch {
		case s.kind == Zipf:
			key = uint32(s.zipf.Uint64())
		case s.kind == Mixed && s.adv > 0 && s.rng.Float64() < s.advP:
			key = uint32(s.rng.IntN(s.adv))
		case s.kind == Mixed:
			key = uint32(s.adv + s.rng.IntN(s.keys-s.adv))
		default:
			key = uint32(s.rng.IntN(s.keys))
		}
		if s.kind == Bursty && (t+s.phase(key))%s.period >= s.on {
			continue
		}
		break
	}
	if s.spread > 0 {
		gw = int(s.mix(uint64(key)<<16|uint64(s.route.IntN(s.spread))) % uint64(s.gateways))
		return t, key, gw, s.route.IntN(s.workers), true
	}
	x := s.route.Float64() * s.cum[len(s.cum)-1]
	gw = min(sort.Search(len(s.cum), func(i int) bool { return s.cum[i] > x }), len(s.cum)-1)
	return t, key, gw, s.route.IntN(s.workers), true
}

// adversarial reports whether key is one of Mixed's abusive keys.
func (s *source) adversarial(key uint32) bool { return s.kind == Mixed && int(key) < s.adv }

// phase is key's offset in its on/off cycle (a hash, so keys need no state).
func (s *source) phase(key uint32) int64 {
	return int64(s.mix(uint64(key)) % uint64(s.period))
}

// mix is splitmix64 of x with the run's seed: stable per key, no state.
func (s *source) mix(x uint64) uint64 {
	x = s.seed ^ x*0x9e3779b97f4a7c15
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

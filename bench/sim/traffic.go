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
}

func newSource(c *Config) *source {
	s := &source{
		kind:    c.Traffic,
		keys:    c.Keys,
		end:     us(c.Duration),
		rng:     rand.New(rand.NewPCG(c.Seed, 0x7472616666696321)),
		route:   rand.New(rand.NewPCG(c.Seed, 0x726f757465212121)),
		seed:    c.Seed,
		workers: c.Workers,
	}
	perKey := c.Load * c.limitRate() / 1e6 // mean arrivals per µs per key
	switch c.Traffic {
	case Bursty:
		s.on, s.period = us(c.BurstOn), us(c.BurstOn)+us(c.BurstOff)
		perKey *= float64(s.period) / float64(s.on) // the same mean over the cycle
	case Zipf:
		s.zipf = rand.NewZipf(s.rng, c.ZipfS, 1, uint64(c.Keys-1))
	}
	s.ratePerU = perKey * float64(c.Keys)
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
		if s.kind == Zipf {
			key = uint32(s.zipf.Uint64())
		} else {
			key = uint32(s.rng.IntN(s.keys))
		}
		if s.kind == Bursty && (t+s.phase(key))%s.period >= s.on {
			continue
		}
		break
	}
	x := s.route.Float64() * s.cum[len(s.cum)-1]
	gw = min(sort.Search(len(s.cum), func(i int) bool { return s.cum[i] > x }), len(s.cum)-1)
	return t, key, gw, s.route.IntN(s.workers), true
}

// phase is key's offset in its on/off cycle (a hash, so keys need no state).
func (s *source) phase(key uint32) int64 {
	x := s.seed ^ uint64(key)*0x9e3779b97f4a7c15
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return int64(x % uint64(s.period))
}

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
	// Realistic: arrivals are sessions of burst requests spread over on µs, queued in
	// pending until their time; a key whose rank is below calmFrom is above its limit;
	// newKeys of the keys are born during the run.
	burst    int
	pending  []arrival
	calmFrom int
	newKeys  float64
}

// arrival is one request of a session, waiting for its time.
type arrival struct {
	t   int64
	key uint32
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
	case Realistic:
		// rand.Zipf draws k with probability ∝ (1+k)^-s: key k's share of the sessions.
		s.zipf = rand.NewZipf(s.rng, c.ZipfS, 1, uint64(c.Keys-1))
		s.burst, s.on, s.newKeys = c.BurstSize, us(c.BurstOn), c.NewKeys
		// Key k is within its limit when Load × (k+1)^-s ≤ 1.
		s.calmFrom = min(c.Keys, int(math.Ceil(math.Pow(max(c.Load, 1), 1/c.ZipfS)-1)))
		for s.calmFrom > 0 && c.Load*math.Pow(float64(s.calmFrom), -c.ZipfS) <= 1 {
			s.calmFrom--
		}
		for s.calmFrom < c.Keys && c.Load*math.Pow(float64(s.calmFrom+1), -c.ZipfS) > 1 {
			s.calmFrom++
		}
		perKey = c.Load * c.limitRate() / 1e6 * zipfSum(c.Keys, c.ZipfS) / float64(c.Keys) / float64(c.BurstSize)
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
	if s.kind == Realistic {
		if t, key, ok = s.nextArrival(); !ok {
			return 0, 0, 0, 0, false
		}
		return s.routed(t, key)
	}
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
	return s.routed(t, key)
}

// routed picks the gateway and worker of a request of key at t.
func (s *source) routed(t int64, key uint32) (int64, uint32, int, int, bool) {
	if s.spread > 0 {
		gw := int(s.mix(uint64(key)<<16|uint64(s.route.IntN(s.spread))) % uint64(s.gateways))
		return t, key, gw, s.route.IntN(s.workers), true
	}
	x := s.route.Float64() * s.cum[len(s.cum)-1]
	gw := min(sort.Search(len(s.cum), func(i int) bool { return s.cum[i] > x }), len(s.cum)-1)
	return t, key, gw, s.route.IntN(s.workers), true
}

// nextArrival is Realistic's next request: the earliest pending request of a session,
// after every session that starts before it has queued its requests. Sessions of a key
// not yet born are not sent; requests past the end of the run are dropped.
func (s *source) nextArrival() (int64, uint32, bool) {
	for s.ratePerU > 0 && (len(s.pending) == 0 || s.t <= float64(s.pending[0].t)) {
		s.t += s.rng.ExpFloat64() / s.ratePerU
		if s.t >= float64(s.end) || math.IsInf(s.t, 0) {
			s.ratePerU = 0 // no more sessions; the queued requests remain
			break
		}
		start := int64(s.t)
		key := uint32(s.zipf.Uint64())
		if start < s.birth(key) {
			continue
		}
		for range s.burst {
			if t := start + s.rng.Int64N(max(s.on, 1)); t < s.end {
				s.push(arrival{t: t, key: key})
			}
		}
	}
	if len(s.pending) == 0 {
		return 0, 0, false
	}
	a := s.pop()
	return a.t, a.key, true
}

// birth is when key starts sending in Realistic (µs from the start; 0 for the keys
// that exist from the start): a hash of the key, so keys need no state.
func (s *source) birth(key uint32) int64 {
	h := s.mix(uint64(key) | 1<<40)
	if float64(h>>11)/(1<<53) >= s.newKeys {
		return 0
	}
	return int64(s.mix(uint64(key)|2<<40) % uint64(max(s.end, 1)))
}

// calm reports whether key's mean rate is within its limit: all keys but Mixed's
// adversarial ones and Realistic's most popular, above their limit.
func (s *source) calm(key uint32) bool {
	switch s.kind {
	case Mixed:
		return !s.adversarial(key)
	case Realistic:
		return int(key) >= s.calmFrom
	}
	return true
}

// push and pop keep pending a binary min-heap on time (ties in push order do not
// matter: simultaneous requests of one µs are decided in any order).
func (s *source) push(a arrival) {
	s.pending = append(s.pending, a)
	for i := len(s.pending) - 1; i > 0; {
		p := (i - 1) / 2
		if s.pending[p].t <= s.pending[i].t {
			break
		}
		s.pending[i], s.pending[p] = s.pending[p], s.pending[i]
		i = p
	}
}

func (s *source) pop() arrival {
	h := s.pending
	a := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < last && h[l].t < h[m].t {
			m = l
		}
		if r < last && h[r].t < h[m].t {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	s.pending = h
	return a
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

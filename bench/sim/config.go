package sim

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
)

// Traffic names a request generator. Every generator is open-loop (clients ignore
// Retry-After) and spreads each request over the gateways by Config.Weights and over a
// gateway's workers uniformly.
type Traffic uint8

const (
	// Steady: every key is a Poisson process at Load × the limit rate.
	Steady Traffic = iota
	// Bursty: every key alternates BurstOn of Poisson arrivals and BurstOff of silence
	// (random phase per key); Load is the mean over the cycle.
	Bursty
	// Zipf: one Poisson stream of Load × limit rate × Keys requests/s whose keys follow a
	// Zipf law (exponent ZipfS): a few keys far above their limit, a long quiet tail.
	Zipf
	// Adversarial: every key is a Poisson process at 10 × the limit rate.
	Adversarial
	// Ninety: every key is a Poisson process at 0.9 × the limit rate (a client a perfect
	// limiter almost never rejects).
	Ninety
	// Mixed: AdversarialShare of the keys at 10 × the limit rate, the others Poisson at
	// Load × the limit rate (default 0.5): a mesh where a few callers abuse their quota.
	Mixed
	// Realistic: the keys of a public API. Key k's mean rate is Load × the limit rate
	// × (k+1)^-ZipfS (Load, default 2, is the most popular key's: above its limit, the
	// next ones near it, a long tail far below); its requests come in sessions of
	// BurstSize requests spread uniformly over BurstOn (a page load, a batch job),
	// sessions arriving as a Poisson process; NewKeys of the keys arrive during the run
	// (uniformly over it) and send nothing before, the others exist from the start.
	// Every key starts cold, most keys are seen a few times, and the keys within their
	// limit (mean rate at most the limit rate) are the calm ones of the Result.
	Realistic
)

var trafficNames = [...]string{Steady: "steady", Bursty: "bursty", Zipf: "zipf", Adversarial: "adversarial", Ninety: "ninety", Mixed: "mixed", Realistic: "realistic"}

func (t Traffic) String() string {
	if int(t) < len(trafficNames) {
		return trafficNames[t]
	}
	return "traffic(" + strconv.Itoa(int(t)) + ")"
}

// ParseTraffic is the inverse of Traffic.String.
func ParseTraffic(s string) (Traffic, error) {
	for i, n := range trafficNames {
		if n == s {
			return Traffic(i), nil
		}
	}
	return 0, fmt.Errorf("unknown traffic %q (want one of %s)", s, strings.Join(trafficNames[:], ", "))
}

// defaultLoad is each generator's offered rate per key as a multiple of the limit rate.
func (t Traffic) defaultLoad() float64 {
	switch t {
	case Adversarial:
		return 10
	case Ninety:
		return 0.9
	case Bursty:
		return 0.8
	case Realistic:
		return 2 // the most popular key's; the rest follow the Zipf law
	}
	return 0.5 // Steady, Zipf, and Mixed's calm keys
}

// Latency is a one-way network delay distribution: Base plus an exponentially
// distributed extra with mean Jitter (0: constant). Each direction of each callout draws
// its own sample.
type Latency struct {
	Base, Jitter time.Duration
}

// String formats l as ParseLatency reads it.
func (l Latency) String() string {
	if l.Jitter == 0 {
		return l.Base.String()
	}
	return l.Base.String() + "+" + l.Jitter.String()
}

// ParseLatency reads "2ms" (constant) or "1ms+3ms" (1 ms plus an exponential extra of
// mean 3 ms).
func ParseLatency(s string) (Latency, error) {
	base, jit, found := strings.Cut(s, "+")
	var l Latency
	var err error
	if l.Base, err = time.ParseDuration(base); err != nil {
		return l, fmt.Errorf("latency %q: %w", s, err)
	}
	if found {
		if l.Jitter, err = time.ParseDuration(jit); err != nil {
			return l, fmt.Errorf("latency %q: %w", s, err)
		}
	}
	if l.Base < 0 || l.Jitter < 0 {
		return l, fmt.Errorf("latency %q: negative", s)
	}
	return l, nil
}

// Window is a span of simulated time from the start of the run.
type Window struct {
	Start, Dur time.Duration
}

// ParseWindow reads "start:duration", e.g. "20s:5s".
func ParseWindow(s string) (Window, error) {
	a, b, ok := strings.Cut(s, ":")
	if !ok {
		return Window{}, fmt.Errorf("window %q: want start:duration", s)
	}
	var w Window
	var err error
	if w.Start, err = time.ParseDuration(a); err != nil {
		return w, fmt.Errorf("window %q: %w", s, err)
	}
	if w.Dur, err = time.ParseDuration(b); err != nil {
		return w, fmt.Errorf("window %q: %w", s, err)
	}
	if w.Start < 0 || w.Dur < 0 {
		return w, fmt.Errorf("window %q: negative", s)
	}
	return w, nil
}

// Config describes one run. The zero value of every field means its default
// (WithDefaults); Run applies them.
type Config struct {
	Seed     uint64
	Duration time.Duration // simulated time (default 10 s)

	Gateways int       // default 4
	Workers  int       // per gateway (default 2)
	Weights  []float64 // share of requests per gateway (nil: equal)
	// Spread > 0 sends each key's requests to Spread gateways of its own (chosen by a
	// hash of the key), as a client keeps a few connections open behind a load
	// balancer; 0: every gateway, by Weights.
	Spread int
	// Skew is the largest clock offset of a gateway from the simulated clock (each
	// gateway draws a whole number of milliseconds in [-Skew, Skew]); it must not
	// change any decision.
	Skew time.Duration

	Keys    int // distinct caller keys (default 10; up to 1<<20 and more)
	Traffic Traffic
	// Load is the mean offered rate per key as a multiple of the limit rate
	// (0: the traffic's default, capped so all keys together offer at most
	// DefaultMaxRate requests/s).
	Load     float64
	BurstOn  time.Duration // Bursty (default 200 ms)
	BurstOff time.Duration // Bursty (default 800 ms)
	ZipfS    float64       // Zipf exponent (> 1, default 1.1)
	// AdversarialShare is the share of keys at 10 × the limit in Mixed (default 0.01).
	AdversarialShare float64
	// BurstSize is the requests of one session in Realistic (default 10).
	BurstSize int
	// NewKeys is the share of keys that arrive during the run in Realistic (default
	// 0.5; negative: none, every key exists from the start).
	NewKeys float64

	// Params is the rule every key is limited by (default: token bucket, 100 per second).
	Params algo.Params

	// Filter settings (rule.Sync; defaults as the filter's, but for the table, whose
	// default here is 4096 slots: the staleness scan reads a share of the table every
	// tick, and a thousand gateways of 65,536 empty slots would cost the simulation a
	// billion reads for nothing).
	Interval        time.Duration // sync tick (100 ms)
	Timeout         time.Duration // callout timeout (250 ms)
	Stale           time.Duration // longest consumption waits unreported (10 s)
	MaxBatch        int           // deltas per callout (1000)
	TableSlots      int           // shared-data slots for buckets (4096)
	BreakerFailures int64         // (3)
	BreakerOpen     time.Duration // (1 s)

	// Network.
	Latency Latency // one-way (default 1ms+1ms)
	Loss    float64 // probability a callout is lost (half up, half down)
	Outage  Window  // the service answers 503 during it (Dur 0: none)

	// Service settings.
	Service     lease.SyncConfig // default lease.DefaultSyncConfig
	FleetWindow time.Duration    // Reply.Nodes counts gateways seen this recently (5 s)
	// ColdFleet starts the service without the gateways counted, as a service meets a
	// fleet that starts with the traffic: each gateway counts once its syncs span the
	// probation (a second), after a refresh, so for about two seconds the fleet is one
	// gateway to the service (store.Config.FleetProbation). Without it the gateways
	// heartbeat for the three seconds before the run, as a running fleet has.
	ColdFleet bool

	// NoPenalty makes the service ignore the early retries gateways report, so it never
	// starts a progressive-penalty cooldown. The product has no such switch: with it off
	// (the default, as deployed) an open-loop adversarial client, which never honours
	// Retry-After, spends most of a run in cooldown and the leases are barely exercised;
	// with it on the run measures the leases alone.
	NoPenalty bool

	// Explain fills Result.Why: held requests and false rejections by cause.
	Explain bool
	// PerKey fills Result.Keys (a few dozen bytes per key).
	PerKey bool
	// SeriesStep > 0 fills Result.Series with one entry per step of simulated time.
	SeriesStep time.Duration
}

// DefaultMaxRate caps the total offered rate when Load is left to its default, so a run
// with a million keys stays cheap.
const DefaultMaxRate = 200_000

// DefaultParams is the rule a Config without Params enforces.
var DefaultParams = algo.Params{Kind: algo.TokenBucket, Limit: 100, WindowUs: 1_000_000}

// WithDefaults returns c with every zero field replaced by its default.
func (c Config) WithDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.Duration, 10*time.Second)
	def(&c.BurstOn, 200*time.Millisecond)
	def(&c.BurstOff, 800*time.Millisecond)
	def(&c.Interval, 100*time.Millisecond)
	def(&c.Timeout, 250*time.Millisecond)
	def(&c.Stale, 10*time.Second)
	def(&c.BreakerOpen, time.Second)
	def(&c.FleetWindow, 5*time.Second)
	if c.Gateways == 0 {
		c.Gateways = 4
	}
	if c.Workers == 0 {
		c.Workers = 2
	}
	if c.Keys == 0 {
		c.Keys = 10
	}
	if c.ZipfS == 0 {
		c.ZipfS = 1.1
	}
	if c.Params.WindowUs == 0 {
		c.Params = DefaultParams
	}
	if c.AdversarialShare == 0 {
		c.AdversarialShare = 0.01
	}
	if c.BurstSize == 0 {
		c.BurstSize = 10
	}
	if c.NewKeys == 0 {
		c.NewKeys = 0.5
	}
	if c.Load == 0 && c.Traffic == Realistic {
		c.Load = c.Traffic.defaultLoad()
		if total := c.Load * c.limitRate() * zipfSum(c.Keys, c.ZipfS); total > DefaultMaxRate {
			c.Load *= DefaultMaxRate / total
		}
	}
	if c.Load == 0 {
		c.Load = c.Traffic.defaultLoad()
		rate := float64(c.Params.Limit) * 1e6 / float64(c.Params.WindowUs)
		if total := c.Load * rate * float64(c.Keys); total > DefaultMaxRate {
			c.Load *= DefaultMaxRate / total
		}
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = 1000
	}
	if c.TableSlots == 0 {
		c.TableSlots = 4096
	}
	if c.BreakerFailures == 0 {
		c.BreakerFailures = 3
	}
	if c.Latency == (Latency{}) {
		c.Latency = Latency{Base: time.Millisecond, Jitter: time.Millisecond}
	}
	if c.Service == (lease.SyncConfig{}) {
		c.Service = lease.DefaultSyncConfig
	}
	c.Service = c.Service.Normalized()
	return c
}

// ErrConfig is wrapped by every error Validate returns.
var ErrConfig = errors.New("sim: invalid config")

// Validate checks a defaulted Config.
func (c *Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, a...)...)
	}
	switch {
	case c.Gateways < 1 || c.Gateways > 1<<12:
		return bad("gateways %d not in [1, 4096]", c.Gateways)
	case c.Workers < 1 || c.Workers > 1<<10:
		return bad("workers %d not in [1, 1024]", c.Workers)
	case c.Weights != nil && len(c.Weights) != c.Gateways:
		return bad("%d weights for %d gateways", len(c.Weights), c.Gateways)
	case c.Keys < 1 || c.Keys > 1<<26:
		return bad("keys %d not in [1, %d]", c.Keys, 1<<26)
	case int(c.Traffic) >= len(trafficNames):
		return bad("traffic %d", c.Traffic)
	case c.Load < 0 || math.IsNaN(c.Load) || math.IsInf(c.Load, 0):
		return bad("load %v", c.Load)
	case c.ZipfS <= 1:
		return bad("zipf exponent %v must be > 1", c.ZipfS)
	case c.Loss < 0 || c.Loss > 1:
		return bad("loss %v not in [0, 1]", c.Loss)
	case c.Spread < 0 || c.Spread > c.Gateways:
		return bad("spread %d not in [0, gateways %d]", c.Spread, c.Gateways)
	case c.BurstSize < 1 || c.BurstSize > 1<<16 || c.NewKeys > 1 || math.IsNaN(c.NewKeys):
		return bad("burst size %d not in [1, 65536] / new keys %v above 1", c.BurstSize, c.NewKeys)
	case c.AdversarialShare < 0 || c.AdversarialShare > 1:
		return bad("adversarial share %v not in [0, 1]", c.AdversarialShare)
	case c.MaxBatch < 1 || c.MaxBatch > 4096 || c.TableSlots < 64 || c.TableSlots > 1<<22:
		return bad("max batch %d not in [1, 4096] / table slots %d not in [64, %d]", c.MaxBatch, c.TableSlots, 1<<22)
	case c.Interval < 10*time.Millisecond || c.Timeout < time.Millisecond || c.Stale < c.Interval:
		return bad("interval %v, timeout %v, stale %v (want interval ≥ 10 ms, timeout ≥ 1 ms, stale ≥ interval)", c.Interval, c.Timeout, c.Stale)
	case c.Duration <= 0 || c.BurstOn <= 0 || c.BurstOff < 0:
		return bad("duration %v / burst %v on %v off", c.Duration, c.BurstOn, c.BurstOff)
	case c.Skew < 0 || c.Skew > time.Hour:
		return bad("skew %v not in [0, 1h]", c.Skew)
	case c.SeriesStep < 0 || (c.SeriesStep > 0 && c.Duration/c.SeriesStep > 1e6):
		return bad("series step %v (at most a million steps)", c.SeriesStep)
	}
	for i, w := range c.Weights {
		if w < 0 || math.IsNaN(w) || math.IsInf(w, 0) {
			return bad("weight[%d] %v", i, w)
		}
	}
	if err := c.Params.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return nil
}

// zipfSum is Σ (k+1)^-s over k < keys: Realistic's total rate in units of the most
// popular key's.
func zipfSum(keys int, s float64) float64 {
	var sum float64
	for k := range keys {
		sum += math.Pow(float64(k+1), -s)
	}
	return sum
}

// limitRate is the rule's steady rate in permits per second.
func (c *Config) limitRate() float64 {
	return float64(c.Params.Limit) * 1e6 / float64(c.Params.WindowUs)
}

func us(d time.Duration) int64 { return d.Microseconds() }

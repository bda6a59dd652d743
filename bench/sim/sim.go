package sim

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/tollgate-rl/tollgate/filter/nativehost"
	"github.com/tollgate-rl/tollgate/internal/backend"
	"github.com/tollgate-rl/tollgate/internal/memservice"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// epochUs is where the simulated clock starts (2023-11-14 in Unix µs): realistic
// magnitudes for varints, window alignment and the record encoding.
const epochUs = 1_700_000_000_000_000

// Result is what one run measured. Rates are per second of simulated time.
type Result struct {
	Config Config // with defaults applied

	Requests    int64
	Admitted    int64
	Rejected    int64
	RefAdmitted int64 // what the reference limiter admitted of the same requests
	// FalseRejections: rejected by the fleet, admitted by the reference;
	// FalseRejectionPct is their share of RefAdmitted, in percent. Calm* count the same
	// for the keys that stay within their limit (all but Mixed's adversarial keys).
	FalseRejections   int64
	FalseRejectionPct float64
	CalmRefAdmitted   int64
	CalmFalse         int64
	CalmFalsePct      float64
	FalseBy           Causes
	// FalseAdmissions: admitted by the fleet, rejected by the reference (informational:
	// the two may admit different requests of a key without either exceeding the limit).
	FalseAdmissions int64

	// OverAdmission is the worst key's largest excess over any window (see the package
	// doc), in permits; OverAdmissionPct is it as a percentage of the bucket capacity, and
	// MeanOverAdmissionPct the mean of that percentage over keys that saw traffic.
	OverAdmission        int64
	OverAdmissionPct     float64
	MeanOverAdmissionPct float64
	WorstKey             uint32
	WorstAt              time.Duration // when the worst key reached its over-admission

	// Degraded counts answers marked degraded, and when the first and last were given.
	Degraded                    int64
	FirstDegraded, LastDegraded time.Duration
	Penalized                   int64 // refusals by a progressive-penalty cooldown

	// Waited counts requests the filter paused (an acquire or a strict check) until the
	// service answered; WaitP99 is the 99th percentile of that wait.
	Waited  int64
	WaitP99 time.Duration

	Syncs, SyncFailures int64 // /v1/sync callouts sent, failed (lost, late, 503)
	Checks              int64 // /v1/check callouts (acquires)
	Replays             int64 // deltas the service answered as replays
	// Deltas applied (one lease.Sync each), script calls (EVALSHA commands, one per 100
	// deltas of a batch) and bytes on the wire.
	Deltas, ScriptCalls  int64
	BytesUp, BytesDown   int64
	LeaseGranted         int64 // permits granted as leases
	Overshoot, Reclaimed int64

	// State per key at the service: buckets alive at the end, and the mean and largest
	// size of their Redis values (bytes).
	Buckets                   int
	StateBytes, StateBytesMax float64

	// Rates per second of simulated time; SyncsPerGateway is /v1/sync callouts per
	// gateway (per Envoy, whatever its workers).
	SyncsPerSec, SyncsPerGateway, ChecksPerSec, DeltasPerSec, RedisOpsPerSec, BytesPerSec float64

	// Keys holds per-key results when Config.PerKey is set.
	Keys []KeyResult
	// Series holds one entry per Config.SeriesStep when it is set.
	Series []Step
	// Why counts held requests and false rejections of calm keys by cause when
	// Config.Explain is set (explain.go).
	Why map[string]int64
}

// Step is what happened during one step of simulated time.
type Step struct {
	Start                                                      time.Duration
	Requests, Admitted, RefAdmitted, FalseRejections, Degraded int64
}

// Causes splits false rejections by what refused them.
type Causes struct {
	Local    int64 // the gateway refused from what it knew (its lease short, the bucket spent)
	Service  int64 // the service refused a paused request's acquire
	Penalty  int64 // progressive-penalty cooldown
	Degraded int64 // local decision while the sync was unhealthy
}

// KeyResult is one key's share of a Result.
type KeyResult struct {
	Requests, Admitted, RefAdmitted, FalseRejections int64
	OverAdmission                                    int64 // largest excess over any window, permits
	Waited                                           int64
}

// keyState is the per-key bookkeeping of the metrics: the reference limiter and the
// shadow bucket fed with the fleet's admissions.
type keyState struct {
	ref, shadow []byte
	requests    uint32
	excess      int64
	excessAt    int64 // when excess was reached
}

// gateway is one Envoy of the fleet: the filter's plugin on every worker, natively.
type gateway struct {
	idx  int
	h    *nativehost.Host
	skew int64
}

// flight is one callout between a gateway and the service.
type flight struct {
	g      *gateway
	c      *nativehost.Callout
	sync   bool
	sent   int64
	status int
	reply  []byte
}

// paused is a request the filter holds until the service answers.
type paused struct {
	key     uint32
	arrived int64
	held    string // why it was held (Config.Explain)
}

type sim struct {
	cfg      Config
	now      int64 // simulated µs since the start
	q        eventQueue
	gws      []*gateway
	svc      *memservice.Service
	src      *source
	net      *rand.Rand
	keys     []keyState
	names    []string
	perKey   []KeyResult
	flights  map[uint64]*flight
	flightID uint64
	paused   map[*nativehost.Stream]paused
	waits    []time.Duration
	res      Result
}

// Run simulates cfg (with defaults applied) and returns what it measured. It panics only
// on an invalid Config; use Config.Validate first for untrusted input.
func Run(cfg Config) Result {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	s := newSim(cfg)
	s.run()
	return s.result()
}

func newSim(cfg Config) *sim {
	s := &sim{
		cfg:     cfg,
		net:     rand.New(rand.NewPCG(cfg.Seed, 0x6e6574776f726b21)),
		keys:    make([]keyState, cfg.Keys),
		names:   make([]string, cfg.Keys),
		flights: map[uint64]*flight{},
		paused:  map[*nativehost.Stream]paused{},
	}
	for k := range s.names {
		s.names[k] = "k" + strconv.Itoa(k)
	}
	s.res.Config = cfg
	if cfg.Explain {
		s.res.Why = map[string]int64{}
	}
	if cfg.SeriesStep > 0 {
		n := (cfg.Duration + cfg.SeriesStep - 1) / cfg.SeriesStep
		s.res.Series = make([]Step, n)
		for i := range s.res.Series {
			s.res.Series[i].Start = time.Duration(i) * cfg.SeriesStep
		}
	}
	if cfg.PerKey {
		s.perKey = make([]KeyResult, cfg.Keys)
	}
	s.svc = memservice.New(cfg.Service)
	s.svc.FleetWindowUs = us(cfg.FleetWindow)
	s.svc.NoPenalty = cfg.NoPenalty
	if !cfg.ColdFleet {
		// The heartbeats of a fleet that ran before the traffic started (the filter's
		// node ids): the service counts every gateway from the start, as one that has
		// heard from them for longer than the probation does.
		for _, at := range []int64{-3_000_000, -2_000_000, -1_000_000} {
			for g := range cfg.Gateways {
				b := wire.Batch{Node: "gw-" + strconv.Itoa(g), Seq: uint64(epochUs + at)}
				if _, err := s.svc.ApplyAt(&b, backend.Options{Idempotent: true}, epochUs+at); err != nil {
					panic("sim: heartbeat: " + err.Error())
				}
			}
		}
	}
	setup := rand.New(rand.NewPCG(cfg.Seed, 0x7365747570212121))
	// Skews have a stream of their own: changing Skew changes nothing else.
	skews := rand.New(rand.NewPCG(cfg.Seed, 0x736b657773212121))
	plugin := pluginConfig(&cfg)
	for g := range cfg.Gateways {
		gw := &gateway{idx: g}
		if cfg.Skew > 0 {
			// Whole milliseconds: records keep times on the local clock's millisecond
			// grid, so a sub-millisecond phase moves a rounding, not a comparison with
			// another clock; the offset between clocks is what must change nothing.
			ms := cfg.Skew.Milliseconds()
			gw.skew = (skews.Int64N(2*ms+1) - ms) * 1000
		}
		h, err := nativehost.New(nativehost.Config{
			Workers: cfg.Workers, PluginConfig: plugin, Seed: cfg.Seed<<20 | uint64(g),
			Clock:      func() int64 { return epochUs + s.now + gw.skew },
			Properties: map[string]string{"node.id": "gw-" + strconv.Itoa(g)},
			OnDecided: func(st *nativehost.Stream) {
				if p, ok := s.paused[st]; ok {
					delete(s.paused, st)
					if s.cfg.Explain {
						s.res.Why[p.held]++ // counted as Waited is: when decided
					}
					s.decided(gw, p.key, p.arrived, st, true)
				}
			},
		})
		if err != nil {
			panic("sim: the filter refused its configuration: " + string(plugin))
		}
		gw.h = h
		s.gws = append(s.gws, gw)
		for w := range cfg.Workers {
			// Each worker VM's tick starts when it did: a random phase.
			s.q.push(event{at: setup.Int64N(us(cfg.Interval)), kind: evTick, gw: int32(g), worker: int32(w)})
		}
	}
	s.src = newSource(&cfg)
	return s
}

// pluginConfig is the filter's configuration for cfg: one rule over the x-api-key
// header, the sync every Interval.
func pluginConfig(c *Config) []byte {
	p := c.Params
	var b bytes.Buffer
	b.WriteString(`{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,"sync":{"cluster":"svc"`)
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"interval_ms", c.Interval.Milliseconds()}, {"timeout_ms", c.Timeout.Milliseconds()},
		{"stale_ms", c.Stale.Milliseconds()}, {"max_batch", int64(c.MaxBatch)}, {"table_slots", int64(c.TableSlots)},
		{"breaker_failures", c.BreakerFailures}, {"breaker_open_ms", c.BreakerOpen.Milliseconds()},
	} {
		b.WriteString(`,"` + f.name + `":` + strconv.FormatInt(f.v, 10))
	}
	b.WriteString(`},"rules":[{"id":"api","algorithm":"` + p.Kind.String() + `","limit":` + strconv.FormatInt(p.Limit, 10) +
		`,"window":"` + strconv.FormatInt(p.WindowUs/1000, 10) + `ms"`)
	if p.Burst > 0 {
		b.WriteString(`,"burst":` + strconv.FormatInt(p.Burst, 10))
	}
	b.WriteString(`}]}`)
	return b.Bytes()
}

const expireEveryUs = 10_000_000

func (s *sim) run() {
	end := us(s.cfg.Duration)
	t, key, gw, wk, more := s.src.next()
	nextExpire := int64(expireEveryUs)
	for {
		// Events at the same µs as a request go first (a reply that arrived is applied).
		if s.q.len() > 0 && (!more || s.q.peek().at <= t) {
			e := s.q.pop()
			if e.at >= end {
				break
			}
			s.now = e.at
			s.handle(e)
			continue
		}
		if !more {
			break
		}
		s.now = t
		s.request(key, s.gws[gw], wk)
		if s.now >= nextExpire {
			s.svc.Expire(epochUs + s.now)
			nextExpire += expireEveryUs
		}
		t, key, gw, wk, more = s.src.next()
	}
	s.now = end
}

// request runs one request for key through worker wk of gateway g.
func (s *sim) request(key uint32, g *gateway, wk int) {
	hdrs := [][2]string{{":method", "GET"}, {":path", "/api"}, {":authority", "api"}, {"x-api-key", s.names[key]}}
	var held string
	if s.cfg.Explain {
		held = s.heldCause(g, key)
	}
	st := g.h.Request(wk, hdrs, nil)
	if st.Decided {
		s.decided(g, key, s.now, st, false)
	} else {
		s.paused[st] = paused{key: key, arrived: s.now, held: held}
	}
	s.dispatch(g)
}

// dispatch sends the callouts gateway g made: each one-way latency is drawn
// independently; a callout is lost with probability Loss, half on the way up (never
// applied), half on the way back (applied, reply lost); a reply that would arrive after
// the timeout is a failure at the timeout (Envoy resets the call), although the service
// applied the batch.
func (s *sim) dispatch(g *gateway) {
	for _, c := range g.h.TakeCallouts() {
		s.flightID++
		f := &flight{g: g, c: c, sent: s.now, sync: c.Header(":path") == "/v1/sync"}
		s.flights[s.flightID] = f
		switch path := c.Header(":path"); {
		case f.sync:
			s.res.Syncs++
		case path == wire.AlivePath:
			// a liveness probe while a sync is slow: no Redis work, not an acquire
		default:
			s.res.Checks++
		}
		s.res.BytesUp += int64(len(c.Body))
		lost := s.net.Float64() < s.cfg.Loss
		upLost := lost && s.net.Float64() < 0.5
		up := s.latency()
		timeout := us(s.cfg.Timeout)
		if upLost || up >= timeout {
			s.q.push(event{at: s.now + timeout, kind: evFail, flight: s.flightID})
			continue
		}
		s.q.push(event{at: s.now + up, kind: evArrive, flight: s.flightID, lostDown: lost && !upLost})
	}
}

func (s *sim) latency() int64 {
	l := us(s.cfg.Latency.Base)
	if j := s.cfg.Latency.Jitter; j > 0 {
		l += int64(s.net.ExpFloat64() * float64(us(j)))
	}
	return l
}

func (s *sim) inOutage(t int64) bool {
	o := s.cfg.Outage
	return o.Dur > 0 && t >= us(o.Start) && t < us(o.Start+o.Dur)
}

func (s *sim) handle(e event) {
	switch e.kind {
	case evTick:
		g := s.gws[e.gw]
		g.h.Tick(int(e.worker))
		s.dispatch(g)
		period := int64(g.h.TickPeriodMs(int(e.worker))) * 1000
		if period <= 0 {
			period = us(s.cfg.Interval)
		}
		s.q.push(event{at: s.now + period, kind: evTick, gw: e.gw, worker: e.worker})
	case evArrive:
		f := s.flights[e.flight]
		timeout := f.sent + us(s.cfg.Timeout)
		answerAt := s.now + s.latency()
		late := e.lostDown || answerAt >= timeout
		if s.inOutage(s.now) {
			f.status, f.reply = 503, []byte("service unavailable")
		} else {
			d0, r0 := s.svc.Deltas, s.svc.Replays
			f.status, f.reply = s.svc.Handle(f.c.Header(":path"), f.c.Body, epochUs+s.now)
			s.res.Deltas += s.svc.Deltas - d0
			s.res.Replays += s.svc.Replays - r0
			s.res.BytesDown += int64(len(f.reply)) // sent, whether or not it arrives
		}
		if late {
			s.q.push(event{at: timeout, kind: evFail, flight: e.flight})
			return
		}
		s.q.push(event{at: answerAt, kind: evReply, flight: e.flight})
	case evReply, evFail:
		f := s.flights[e.flight]
		delete(s.flights, e.flight)
		if e.kind == evFail || f.status != 200 {
			if f.sync {
				s.res.SyncFailures++
			}
		}
		if e.kind == evFail {
			f.g.h.Fail(f.c, true)
		} else {
			f.g.h.Respond(f.c, [][2]string{{":status", strconv.Itoa(f.status)}}, f.reply)
		}
		s.dispatch(f.g)
	}
}

// decided accounts for one answered request: the reference limiter decides the same
// request at its arrival, the shadow bucket takes the fleet's admission.
func (s *sim) decided(g *gateway, key uint32, arrived int64, st *nativehost.Stream, waited bool) {
	p := s.cfg.Params
	ks := &s.keys[key]
	ks.requests++
	s.res.Requests++
	ref := algo.Decide(p, ks.ref, epochUs+arrived, 1)
	ks.ref = append(ks.ref[:0], ref.State...)
	calm := s.src.calm(key)
	if ref.Allowed {
		s.res.RefAdmitted++
		if calm {
			s.res.CalmRefAdmitted++
		}
	}
	degraded := st.Header("x-ratelimit-policy") == "degraded"
	admitted := st.Admitted()
	if waited {
		s.res.Waited++
		s.waits = append(s.waits, time.Duration(s.now-arrived)*time.Microsecond)
	}
	if degraded {
		s.res.Degraded++
		if s.res.Degraded == 1 {
			s.res.FirstDegraded = time.Duration(s.now) * time.Microsecond
		}
		s.res.LastDegraded = time.Duration(s.now) * time.Microsecond
	}
	penalized := !admitted && st.Local != nil && bytes.Contains(st.Local.Body, []byte(`"penalty_level"`))
	if penalized {
		s.res.Penalized++
	}
	var step *Step
	if s.res.Series != nil {
		step = &s.res.Series[arrived/us(s.cfg.SeriesStep)]
		step.Requests++
		if ref.Allowed {
			step.RefAdmitted++
		}
		if degraded {
			step.Degraded++
		}
		if admitted {
			step.Admitted++
		} else if ref.Allowed {
			step.FalseRejections++
		}
	}
	var kr *KeyResult
	if s.perKey != nil {
		kr = &s.perKey[key]
		kr.Requests++
		if ref.Allowed {
			kr.RefAdmitted++
		}
		if waited {
			kr.Waited++
		}
	}
	if !admitted {
		s.res.Rejected++
		if !ref.Allowed {
			return
		}
		s.res.FalseRejections++
		if calm {
			s.res.CalmFalse++
			if s.cfg.Explain {
				s.res.Why[s.why(g, key, waited, penalized, degraded)]++
			}
		}
		if kr != nil {
			kr.FalseRejections++
		}
		switch {
		case penalized:
			s.res.FalseBy.Penalty++
		case degraded:
			s.res.FalseBy.Degraded++
		case waited:
			s.res.FalseBy.Service++
		default:
			s.res.FalseBy.Local++
		}
		return
	}
	s.res.Admitted++
	if !ref.Allowed {
		s.res.FalseAdmissions++
	}
	now := epochUs + s.now
	ks.shadow = algo.Take(p, ks.shadow, now, 1)
	if debt := -algo.Available(p, ks.shadow, now); debt > ks.excess {
		ks.excess = debt
		ks.excessAt = s.now
	}
	if kr != nil {
		kr.Admitted++
		kr.OverAdmission = ks.excess
	}
}

func (s *sim) result() Result {
	r := s.res
	secs := s.cfg.Duration.Seconds()
	r.ScriptCalls = s.svc.ScriptCalls
	r.LeaseGranted = s.svc.Granted
	r.Overshoot = s.svc.Overshoot
	r.Reclaimed = s.svc.Reclaimed
	r.SyncsPerSec = float64(r.Syncs) / secs
	r.SyncsPerGateway = r.SyncsPerSec / float64(s.cfg.Gateways)
	r.ChecksPerSec = float64(r.Checks) / secs
	r.DeltasPerSec = float64(r.Deltas) / secs
	r.RedisOpsPerSec = float64(r.ScriptCalls) / secs
	r.BytesPerSec = float64(r.BytesUp+r.BytesDown) / secs
	if r.RefAdmitted > 0 {
		r.FalseRejectionPct = 100 * float64(r.FalseRejections) / float64(r.RefAdmitted)
	}
	if r.CalmRefAdmitted > 0 {
		r.CalmFalsePct = 100 * float64(r.CalmFalse) / float64(r.CalmRefAdmitted)
	}
	if len(s.waits) > 0 {
		slices.Sort(s.waits)
		r.WaitP99 = s.waits[(len(s.waits)*99)/100]
	}
	var mx int
	r.Buckets, r.StateBytes, mx = s.svc.Buckets(epochUs + s.now)
	r.StateBytesMax = float64(mx)
	capacity := float64(s.cfg.Params.Capacity())
	var sum float64
	var active int
	for k := range s.keys {
		ks := &s.keys[k]
		if ks.requests == 0 {
			continue
		}
		active++
		sum += 100 * float64(ks.excess) / capacity
		if ks.excess > r.OverAdmission {
			r.OverAdmission, r.WorstKey = ks.excess, uint32(k)
			r.WorstAt = time.Duration(ks.excessAt) * time.Microsecond
		}
	}
	r.OverAdmissionPct = 100 * float64(r.OverAdmission) / capacity
	if active > 0 {
		r.MeanOverAdmissionPct = sum / float64(active)
	}
	r.Keys = s.perKey
	return r
}

// Event queue: a binary min-heap on (at, seq); seq makes ties first-in first-out, so the
// order of simultaneous events never depends on the heap's shape.
type eventKind uint8

const (
	evTick eventKind = iota
	evArrive
	evReply
	evFail
)

type event struct {
	at       int64
	seq      uint64
	flight   uint64
	gw       int32
	worker   int32
	kind     eventKind
	lostDown bool
}

type eventQueue struct {
	h   []event
	seq uint64
}

func (q *eventQueue) len() int     { return len(q.h) }
func (q *eventQueue) peek() *event { return &q.h[0] }

func (q *eventQueue) less(i, j int) bool {
	a, b := &q.h[i], &q.h[j]
	return a.at < b.at || (a.at == b.at && a.seq < b.seq)
}

func (q *eventQueue) push(e event) {
	q.seq++
	e.seq = q.seq
	q.h = append(q.h, e)
	for i := len(q.h) - 1; i > 0; {
		p := (i - 1) / 2
		if !q.less(i, p) {
			break
		}
		q.h[i], q.h[p] = q.h[p], q.h[i]
		i = p
	}
}

func (q *eventQueue) pop() event {
	e := q.h[0]
	last := len(q.h) - 1
	q.h[0] = q.h[last]
	q.h = q.h[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < last && q.less(l, m) {
			m = l
		}
		if r < last && q.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		q.h[i], q.h[m] = q.h[m], q.h[i]
		i = m
	}
	return e
}

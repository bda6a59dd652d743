package sim

import (
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
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
	// FalseRejectionPct is their share of RefAdmitted, in percent.
	FalseRejections   int64
	FalseRejectionPct float64
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

	// Degraded counts decisions lease.Decide marked degraded, and when the first and last
	// were made: no valid lease because the breaker was open or the bucket had no
	// successful sync within LeaseTTL — which also happens, in a healthy fleet, to a
	// bucket that saw no traffic at a gateway for LeaseTTL.
	Degraded                    int64
	FirstDegraded, LastDegraded time.Duration
	Penalized                   int64 // requests rejected by a progressive-penalty cooldown
	BreakerOpens                int64

	Syncs, SyncFailures         int64 // callouts sent, failed (lost, late, 503)
	Replays                     int64 // deltas the service answered as replays (seq not newer)
	SyncDropped, PendingDropped int64
	// Deltas applied (one lease.Sync each), script calls (EVALSHA commands) and
	// pipeline round trips.
	Deltas, ScriptCalls, RoundTrips int64
	BytesUp, BytesDown              int64
	LeaseGranted                    int64 // permits granted as leases
	Overshoot                       int64 // Σ SyncResult.Overshoot: charged while the bucket was in debt
	Reclaimed                       int64 // lease reclaimed from expired nodes by the service

	// RedisOpsPerSec counts script calls; DeltasPerSec the bucket updates they carry.
	SyncsPerSec, DeltasPerSec, RedisOpsPerSec, RoundTripsPerSec, BytesPerSec float64

	// Keys holds per-key results when Config.PerKey is set.
	Keys []KeyResult
	// Series holds one entry per Config.SeriesStep when it is set.
	Series []Step
}

// Step is what happened during one step of simulated time.
type Step struct {
	Start                                                      time.Duration
	Requests, Admitted, RefAdmitted, FalseRejections, Degraded int64
}

// Causes splits false rejections by what rejected them.
type Causes struct {
	Lease    int64 // synced, lease and overdraft slice spent
	Penalty  int64 // progressive-penalty cooldown
	Degraded int64 // local decision while the sync was unhealthy
	Cold     int64 // local decision before the bucket's first reply
}

// KeyResult is one key's share of a Result.
type KeyResult struct {
	Requests, Admitted, RefAdmitted, FalseRejections int64
	OverAdmission                                    int64 // largest excess over any window, permits
	// OverdraftIssued is Σ over every reply applied to this key's records of the
	// overdraft slice it set (floor(max(remaining,0)/nodes), RATIONALE §2): the term that
	// bounds healthy over-admission (§3).
	OverdraftIssued int64
	// ColdAdmitted and DegradedAdmitted count admissions decided locally before the
	// record's first reply and while the sync was unhealthy.
	ColdAdmitted, DegradedAdmitted int64
}

// keyState is the per-key bookkeeping of the metrics: the reference limiter and the
// shadow bucket fed with the fleet's admissions.
type keyState struct {
	ref, shadow       [algo.MaxStateSize]byte
	refLen, shadowLen uint8
	requests          uint32
	excess            int64
	excessAt          int64 // when excess was reached
}

type sim struct {
	cfg     Config
	now     int64 // simulated µs since the start
	q       eventQueue
	gws     []*gateway
	workers []*worker
	svc     *service
	src     *source
	net     *rand.Rand
	calls   map[uint64]*call
	callSeq uint64
	keys    []keyState
	perKey  []KeyResult
	res     Result
	// scratch
	rec lease.Record
	buf []byte
}

// call is one callout in flight. Its fate is drawn when it is sent.
type call struct {
	id       uint64
	w        *worker
	batch    *outBatch
	sent     int64
	up, down int64
	lostUp   bool
	lostDown bool
	reply    *wire.Reply
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
		cfg:   cfg,
		net:   rand.New(rand.NewPCG(cfg.Seed, 0x6e6574776f726b21)),
		calls: map[uint64]*call{},
		keys:  make([]keyState, cfg.Keys),
	}
	s.res.Config = cfg
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
	setup := rand.New(rand.NewPCG(cfg.Seed, 0x7365747570212121))
	// Skews have a stream of their own: changing Skew changes nothing else.
	skews := rand.New(rand.NewPCG(cfg.Seed, 0x736b657773212121))
	interval := us(cfg.Interval)
	for g := range cfg.Gateways {
		gw := &gateway{idx: g, node: "gw-" + strconv.Itoa(g), recs: map[uint32]int32{}}
		if cfg.Skew > 0 {
			gw.skew = skews.Int64N(2*us(cfg.Skew)+1) - us(cfg.Skew)
		}
		s.gws = append(s.gws, gw)
		for w := range cfg.Workers {
			wk := &worker{
				g: gw, id: uint32(w), gi: len(s.workers),
				pendingIdx: map[uint32]int32{},
				breaker:    lease.Breaker{Failures: cfg.BreakerFailures, OpenUs: us(cfg.BreakerOpen)},
			}
			wk.seq = uint64(gw.local(s))
			gw.workers = append(gw.workers, wk)
			s.workers = append(s.workers, wk)
			// Each worker VM's tick starts when it did: a random phase.
			s.q.push(event{at: setup.Int64N(interval), kind: evTick, worker: int32(wk.gi)})
		}
	}
	s.svc = newService(s.gws, cfg.Shards)
	s.src = newSource(&cfg)
	return s
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
		s.request(key, s.gws[gw].workers[wk])
		if s.now >= nextExpire {
			s.svc.expire(epochUs + s.now)
			nextExpire += expireEveryUs
		}
		t, key, gw, wk, more = s.src.next()
	}
	s.now = end
}

// request decides one request on worker w as filter/plugin's decide does for a request
// with one bucket: lease.Decide on the gateway's record, store the new record (admitted
// or rejected), record the consumption for the next batch, flush early if an admitted
// decision asks for it.
func (s *sim) request(key uint32, w *worker) {
	p := s.cfg.Params
	g := w.g
	rec := &s.rec
	g.load(key, rec)
	synced := rec.Synced()
	next, dec := lease.Decide(*rec, p, g.local(s), 1, w.env(s))
	s.buf = g.store(key, &next, s.buf)
	w.record(s, key, &dec, synced)
	if dec.Allowed && dec.Flush && !w.inflight {
		w.flush(s)
	}
	s.account(key, &dec, synced)
}

// account updates the metrics for one decision: the reference limiter decides the same
// request, the shadow bucket takes the fleet's admission.
func (s *sim) account(key uint32, dec *lease.Decision, synced bool) {
	p := s.cfg.Params
	now := epochUs + s.now
	ks := &s.keys[key]
	ks.requests++
	s.res.Requests++
	ref := algo.Decide(p, ks.ref[:ks.refLen], now, 1)
	ks.refLen = uint8(copy(ks.ref[:], ref.State))
	if ref.Allowed {
		s.res.RefAdmitted++
	}
	if dec.Degraded {
		s.res.Degraded++
		if s.res.Degraded == 1 {
			s.res.FirstDegraded = time.Duration(s.now) * time.Microsecond
		}
		s.res.LastDegraded = time.Duration(s.now) * time.Microsecond
	}
	if dec.Penalized {
		s.res.Penalized++
	}
	var st *Step
	if s.res.Series != nil {
		st = &s.res.Series[s.now/us(s.cfg.SeriesStep)]
		st.Requests++
		if ref.Allowed {
			st.RefAdmitted++
		}
		if dec.Degraded {
			st.Degraded++
		}
		if dec.Allowed {
			st.Admitted++
		} else if ref.Allowed {
			st.FalseRejections++
		}
	}
	var kr *KeyResult
	if s.perKey != nil {
		kr = &s.perKey[key]
		kr.Requests++
		if ref.Allowed {
			kr.RefAdmitted++
		}
	}
	if !dec.Allowed {
		s.res.Rejected++
		if !ref.Allowed {
			return
		}
		s.res.FalseRejections++
		if kr != nil {
			kr.FalseRejections++
		}
		switch {
		case dec.Penalized:
			s.res.FalseBy.Penalty++
		case dec.Degraded:
			s.res.FalseBy.Degraded++
		case !synced:
			s.res.FalseBy.Cold++
		default:
			s.res.FalseBy.Lease++
		}
		return
	}
	s.res.Admitted++
	if !ref.Allowed {
		s.res.FalseAdmissions++
	}
	sh := algo.Take(p, ks.shadow[:ks.shadowLen], now, 1)
	ks.shadowLen = uint8(copy(ks.shadow[:], sh))
	if debt := -algo.Available(p, sh, now); debt > ks.excess {
		ks.excess = debt
		ks.excessAt = s.now
	}
	if kr != nil {
		kr.Admitted++
		kr.OverAdmission = ks.excess
		switch {
		case dec.Degraded:
			kr.DegradedAdmitted++
		case !synced:
			kr.ColdAdmitted++
		}
	}
}

func (s *sim) keyOverdraft(key uint32, slice int64) {
	if s.perKey != nil {
		s.perKey[key].OverdraftIssued += slice
	}
}

// send starts w's unacked batch as a callout and draws its fate: lost on the way up
// (never applied), lost on the way back (applied, no reply), late (applied, reply after
// the timeout), refused (outage) or answered.
func (s *sim) send(w *worker) {
	s.callSeq++
	c := &call{id: s.callSeq, w: w, batch: w.unacked, sent: s.now}
	lost := s.net.Float64() < s.cfg.Loss
	up := s.net.Float64() < 0.5
	c.lostUp, c.lostDown = lost && up, lost && !up
	c.up, c.down = s.latency(), s.latency()
	w.inflight, w.call = true, c.id
	s.calls[c.id] = c
	s.res.Syncs++
	s.res.BytesUp += int64(c.batch.size)
	timeout := us(s.cfg.Timeout)
	if c.lostUp || c.up >= timeout {
		s.q.push(event{at: s.now + timeout, kind: evFail, call: c.id})
		return
	}
	s.q.push(event{at: s.now + c.up, kind: evApply, call: c.id})
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
		w := s.workers[e.worker]
		w.flush(s)
		s.q.push(event{at: s.now + us(s.cfg.Interval), kind: evTick, worker: e.worker})
	case evApply:
		c := s.calls[e.call]
		timeout := c.sent + us(s.cfg.Timeout)
		answerAt := s.now + c.down
		late := c.lostDown || answerAt >= timeout
		if s.inOutage(s.now) {
			// 503: nothing applied; the gateway learns it with the answer (or at the
			// timeout if the answer is lost or late).
			at := answerAt
			if late {
				at = timeout
			}
			s.q.push(event{at: at, kind: evFail, call: c.id})
			return
		}
		c.reply = s.svc.apply(s, c.batch)
		s.buf, _ = wire.AppendReply(s.buf[:0], c.reply)
		s.res.BytesDown += int64(len(s.buf)) // sent, whether or not it arrives
		if late {
			s.q.push(event{at: timeout, kind: evFail, call: c.id})
			return
		}
		s.q.push(event{at: answerAt, kind: evReply, call: c.id})
	case evReply, evFail:
		c := s.calls[e.call]
		delete(s.calls, e.call)
		w := c.w
		if !w.inflight || w.call != c.id {
			return
		}
		if e.kind == evReply {
			w.onReply(s, c)
		} else {
			w.onFailure(s)
		}
	}
}

func (s *sim) result() Result {
	r := s.res
	secs := s.cfg.Duration.Seconds()
	r.SyncsPerSec = float64(r.Syncs) / secs
	r.DeltasPerSec = float64(r.Deltas) / secs
	r.RedisOpsPerSec = float64(r.ScriptCalls) / secs
	r.RoundTripsPerSec = float64(r.RoundTrips) / secs
	r.BytesPerSec = float64(r.BytesUp+r.BytesDown) / secs
	if r.RefAdmitted > 0 {
		r.FalseRejectionPct = 100 * float64(r.FalseRejections) / float64(r.RefAdmitted)
	}
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
	evApply
	evReply
	evFail
)

type event struct {
	at     int64
	seq    uint64
	call   uint64
	worker int32
	kind   eventKind
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

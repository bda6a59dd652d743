// Package rlqs serves Envoy's rate limit quota service (RLQS,
// envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas, the
// protocol of Envoy's envoy.filters.http.rate_limit_quota filter) on Tollgate's quotas:
// Envoys without Wasm enforce, locally, their share of the same Redis buckets the Wasm
// filter and the gRPC RLS path charge.
//
// Each Envoy holds one stream; each stream is a node of the fleet under a node id of its
// own (counted in the fleet size like a gateway: the stream heartbeats while it is open,
// since Envoy reports only every 5 s, so gateways size their cold starts with it). A report's bucket (its BucketId's entries, in
// the order of their keys) selects rules as a descriptor does on the RLS path
// (rule.Config.ApplyDescriptor, the report's domain), so one rule set serves both. What
// the Envoy admitted is charged to every selected window through the store's batch path
// (service.Sync: idempotent per stream and report, no lease granted: an Envoy's token
// bucket is not a reservation). Every report is answered, and every change of the
// Envoys using a key or of the rule set pushed, with the Envoy's assignment: a token
// bucket of its share of the window (shareOf: the rate and capacity shared among the
// Envoys that had requests on the key lately by their demand, demand.portion; its
// max_tokens never above its share of
// what the global bucket held at its last report), or a blanket deny while the global
// bucket is spent, each with a time to live after which the Envoy's configured
// expired_assignment_behavior decides. Before the service exits every stream gets a
// TTL-0 assignment (the Envoy falls back at once, rather than when the TTL ends).
// RATIONALE.md "Envoy's rate_limit_quota filter" states the bounds.
package rlqs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-rl/tollgate/ratelimit/service"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/rule"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Bounds of one stream. Envoy's configuration, not a client, decides how many buckets
// there are, but a header value becomes a bucket: a caller sending ever new keys makes
// ever new buckets, so the table is bounded and idle buckets are abandoned.
const (
	// MaxBuckets per stream: a bucket beyond it is charged but not answered (the Envoy's
	// no_assignment_behavior decides it), counted.
	MaxBuckets = 100_000
	// emptyValueKey stands for an empty entry value, as on the RLS path.
	emptyValueKey = "\x00"
)

// Options configure the service.
type Options struct {
	// ReportInterval is how often Envoy reports (5 s, fixed in Envoy 1.40). Assignments
	// live TTL = 2·ReportInterval + 1 s: one lost report does not expire them.
	ReportInterval time.Duration
	// Heartbeat is how often an open stream counts in the fleet between reports (1 s;
	// the store counts nodes seen within 5 s). Each heartbeat also pushes assignments
	// whose share changed.
	Heartbeat time.Duration
	// IdleAfter: a bucket with no request for this long is abandoned (60 s).
	IdleAfter time.Duration
}

func (o Options) normalized() Options {
	if o.ReportInterval <= 0 {
		o.ReportInterval = 5 * time.Second
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = time.Second
	}
	if o.IdleAfter <= 0 {
		o.IdleAfter = time.Minute
	}
	return o
}

// Server answers StreamRateLimitQuotas. Create with New, add to a gRPC server with
// Register (the RLS path's server, behind its authentication).
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	svc *service.Service
	log *slog.Logger
	o   Options
	m   *metrics

	mu      sync.Mutex
	streams map[*stream]struct{}
	closed  bool
	done    chan struct{} // closed by Close: every stream ends
	// using: per bucket (canonical BucketId), the streams that had requests in it and
	// when they last reported some.
	using map[string]map[*stream]use
}

// use is what the service knows of one stream's requests in one bucket: its last two
// reports (two reports smooth the count of a slow key: 2 or 3 requests in 5 s is the
// same client).
type use struct {
	at             int64 // the last report with requests in the bucket
	req, prevReq   int64 // requests (admitted and denied) in the last report, the one before
	span, prevSpan int64 // what those reports covered, µs
}

// rate is the stream's requests a second ×1000 over its last two reports, taken over at
// least horizonUs (two report intervals). A stream new to the key had no requests on it
// before its first report (the first request creates Envoy's bucket and sends that
// report at once, covering no time), so over two intervals its reports are all it was
// asked. Dividing by what the reports covered instead counted a light Envoy's first
// request in no time at all: 2 requests "in 5 s" from a client sending one every 5.5 s,
// twice its rate, which the busy Envoy of an uneven client then went without.
func (u use) rate(horizonUs int64) int64 {
	return (u.req + u.prevReq) * 1_000_000_000 / max(u.span+u.prevSpan, horizonUs, 1_000_000)
}

// touch records st's report of bucket k: requests (admitted and denied) over spanUs. A
// report without requests counts in the stream's rate but not in when it last used the
// key (st.mu held; s.mu after it).
func (s *Server) touch(k string, st *stream, now, requests, spanUs int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.using[k]
	if m == nil {
		if requests == 0 {
			return
		}
		m = map[*stream]use{}
		s.using[k] = m
	}
	u, ok := m[st]
	if !ok && requests == 0 {
		return
	}
	u.prevReq, u.prevSpan = u.req, u.span
	u.req, u.span = min(requests, 1<<32), max(spanUs, 0)
	if requests > 0 {
		u.at = now
	}
	m[st] = u
}

// demand is what the streams that had requests in bucket k within two report intervals
// and a heartbeat asked of it lately, st's own first (0 when st had none lately): what
// its rule is shared by (demand.portion).
func (s *Server) demand(k string, st *stream, now int64) demand {
	s.mu.Lock()
	defer s.mu.Unlock()
	span := 2 * s.o.ReportInterval.Microseconds()
	horizon := span + s.o.Heartbeat.Microseconds()
	var d demand
	for o, u := range s.using[k] {
		if now-u.at > horizon {
			delete(s.using[k], o)
			continue
		}
		if o == st {
			d.mine = u.rate(span)
		} else {
			d.others = append(d.others, u.rate(span))
		}
	}
	if len(s.using[k]) == 0 {
		delete(s.using, k)
	}
	slices.Sort(d.others) // one demand, one order: a change is a change of numbers
	return d
}

// New builds the service on svc (its rule set, batch path and metrics registry).
func New(svc *service.Service, log *slog.Logger, o Options) *Server {
	if log == nil {
		log = slog.Default()
	}
	return &Server{svc: svc, log: log, o: o.normalized(), m: newMetrics(svc.Metrics().Registry), streams: map[*stream]struct{}{},
		done: make(chan struct{}), using: map[string]map[*stream]use{}}
}

// Register adds the service to g.
func (s *Server) Register(g *grpc.Server) { rlqsv3.RegisterRateLimitQuotaServiceServer(g, s) }

// Close sends every open stream a TTL-0 assignment for each of its buckets (the Envoy
// falls back to its expired_assignment_behavior now) and ends the streams. Call it
// before the gRPC server stops (a graceful stop waits for the streams to end).
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	all := make([]*stream, 0, len(s.streams))
	for st := range s.streams {
		all = append(all, st)
	}
	s.mu.Unlock()
	for _, st := range all {
		st.expireAll()
	}
	close(s.done)
}

type metrics struct {
	streams  prometheus.Gauge
	reports  *prometheus.CounterVec // outcome
	requests *prometheus.CounterVec // allowed, denied (as Envoy reported them)
	pushes   *prometheus.CounterVec // reason
	buckets  *prometheus.CounterVec // outcome
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_rlqs_streams",
			Help: "Open RLQS streams (one per Envoy)."}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_rlqs_reports_total",
			Help: "Usage reports by outcome (ok; failed: Redis did not answer, the counts are lost and the Envoy keeps its assignment until its TTL)."}, []string{"outcome"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_rlqs_requests_total",
			Help: "Requests Envoys reported, by their decision (allowed, denied)."}, []string{"decision"}),
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_rlqs_assignments_total",
			Help: "Bucket actions sent, by why (report: the answer to a report; change: pushed because the share, the rule set or a deny changed; fail_closed: a fail-closed rule's bucket denied while Redis does not take reports; abandon: idle; shutdown: TTL 0)."}, []string{"reason"}),
		buckets: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_rlqs_buckets_total",
			Help: "Reported buckets by outcome (unmatched: no rule selects it, ALLOW_ALL; table_full: beyond 100,000 on one stream, not answered)."}, []string{"outcome"}),
	}
	reg.MustRegister(m.streams, m.reports, m.requests, m.pushes, m.buckets)
	return m
}

// StreamRateLimitQuotas serves one Envoy's stream.
func (s *Server) StreamRateLimitQuotas(ss grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	st := newStream(s, ss)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return status.Error(codes.Unavailable, "rlqs: service stopping")
	}
	s.streams[st] = struct{}{}
	s.mu.Unlock()
	s.m.streams.Inc()
	defer func() {
		st.mu.Lock()
		s.mu.Lock()
		delete(s.streams, st)
		for k := range st.buckets {
			if m := s.using[k]; m != nil {
				delete(m, st)
				if len(m) == 0 {
					delete(s.using, k)
				}
			}
		}
		s.mu.Unlock()
		st.mu.Unlock()
		s.m.streams.Dec()
		close(st.quit)
	}()
	go st.heartbeat()
	errc := make(chan error, 1)
	go func() {
		for {
			rep, err := ss.Recv()
			if err != nil {
				errc <- err
				return
			}
			st.report(rep)
		}
	}()
	select {
	case err := <-errc:
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	case <-s.done:
		return status.Error(codes.Unavailable, "rlqs: service stopping")
	}
}

// bucket is one BucketId of one stream.
type bucket struct {
	id      *rlqsv3.BucketId
	entries []rule.DescriptorEntry
	lastUs  int64 // last report (the elapsed time of the next one is measured from it)
	usedUs  int64 // last report with a request
	// denyUntilUs: the global bucket was spent at the last report; the Envoy denies until
	// then (a heartbeat lifts it).
	denyUntilUs int64
	// burst caps the token bucket's max_tokens: this node's share of what the global
	// bucket held at the last report (-1: not heard yet, the share's own). Envoy 1.40
	// starts a first token bucket (and one after a blanket rule) full, and a changed
	// one at the fill ratio of the one it replaces: either way it holds at most
	// max_tokens, which must never exceed what the global bucket backs.
	burst int64
	// dem is what the Envoys (streams of this replica) that used the key lately asked
	// of it: its rule is shared by it (Server.demand, demand.portion).
	dem  demand
	sent assignment // the last action sent
}

// assignment is what an action said, to tell whether a new one differs.
type assignment struct {
	kind  int // 0 none, 1 allow all, 2 deny all, 3 token bucket
	share share
}

type stream struct {
	s    *Server
	ss   grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]
	node string
	quit chan struct{}

	sendMu sync.Mutex // gRPC sends are not safe concurrently

	mu      sync.Mutex
	seq     uint64
	domain  string
	buckets map[string]*bucket
	cfg     *rule.Config
}

func newStream(s *Server, ss grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) *stream {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return &stream{s: s, ss: ss, node: "tollgate-rlqs-" + hex.EncodeToString(b[:]), quit: make(chan struct{}),
		seq: uint64(time.Now().UnixMicro()), buckets: map[string]*bucket{}}
}

func nowUs() int64 { return time.Now().UnixMicro() }

// canonical is a BucketId's table key and its entries in the order of their keys.
func canonical(id *rlqsv3.BucketId) (string, []rule.DescriptorEntry) {
	keys := make([]string, 0, len(id.GetBucket()))
	for k := range id.GetBucket() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sb strings.Builder
	entries := make([]rule.DescriptorEntry, 0, len(keys))
	for _, k := range keys {
		v := id.GetBucket()[k]
		sb.WriteString(k)
		sb.WriteByte(0)
		sb.WriteString(v)
		sb.WriteByte(0)
		if v == "" {
			v = emptyValueKey
		}
		entries = append(entries, rule.DescriptorEntry{Key: k, Value: v})
	}
	return sb.String(), entries
}

// windowRef is one charged window of one report.
type windowRef struct {
	bucket string // stream bucket key
	delta  int
}

// report charges a usage report and answers every bucket in it.
func (st *stream) report(rep *rlqsv3.RateLimitQuotaUsageReports) {
	ctx := st.ss.Context()
	cfg := st.s.svc.RuleSet(ctx)
	now := nowUs()
	st.mu.Lock()
	if st.domain == "" {
		st.domain = rep.GetDomain() // sent in the first report only
	}
	st.seq++
	b := wire.Batch{Node: st.node, Seq: st.seq}
	type key struct {
		key, rule, tier string
		w               uint8
	}
	index := map[key]int{}
	var refs []windowRef
	var order []string
	for _, u := range rep.GetBucketQuotaUsages() {
		if u.GetBucketId() == nil || len(u.GetBucketId().GetBucket()) == 0 {
			continue
		}
		k, entries := canonical(u.GetBucketId())
		k = st.domain + "\x00" + k
		bk := st.buckets[k]
		if bk == nil {
			if len(st.buckets) >= MaxBuckets {
				st.s.m.buckets.WithLabelValues("table_full").Inc()
				continue
			}
			bk = &bucket{id: u.GetBucketId(), entries: entries, burst: -1}
			st.buckets[k] = bk
		}
		allowed, denied := int64(min(u.GetNumRequestsAllowed(), 1<<32-1)), int64(min(u.GetNumRequestsDenied(), 1<<32-1))
		st.s.m.requests.WithLabelValues("allowed").Add(float64(allowed))
		st.s.m.requests.WithLabelValues("denied").Add(float64(denied))
		// The span the counts cover bounds what the store charges (lease.ReportBound): the
		// time since this stream's last report of the bucket, or, for a bucket new to the
		// stream (an Envoy reconnected after a restart, with what it admitted meanwhile),
		// the span Envoy itself reports, in whole seconds.
		elapsedMs := min(u.GetTimeElapsed().AsDuration().Milliseconds(), 3_600_000)
		if bk.lastUs > 0 {
			elapsedMs = (now - bk.lastUs) / 1000
		}
		bk.lastUs = now
		if allowed+denied > 0 || bk.usedUs == 0 {
			bk.usedUs = now
		}
		st.s.touch(k, st, now, allowed+denied, elapsedMs*1000)
		order = append(order, k)
		if cfg == nil || cfg.Off() {
			continue
		}
		for _, a := range cfg.ApplyDescriptor(st.domain, entries, nil) {
			cost := max(a.Cost, 1)
			for w, prm := range a.Windows {
				wk := key{a.Key, a.Rule.ID, a.Tier, uint8(w)}
				di, seen := index[wk]
				if !seen {
					di = len(b.Deltas)
					index[wk] = di
					b.Deltas = append(b.Deltas, wire.Delta{Key: a.Key, Rule: a.Rule.ID, Tier: a.Tier, Window: uint8(w),
						ElapsedMs: u32(elapsedMs), Algo: uint8(prm.Kind), Limit: u32(prm.Limit), WindowMs: u32(prm.WindowUs / 1000), Burst: u32(prm.Burst)})
				}
				// Envoy counts requests: each costs the rule's cost. What it admitted is
				// charged as admitted outside a lease (its token bucket reserves nothing).
				d := &b.Deltas[di]
				d.Over = u32(int64(d.Over) + allowed*cost)
				d.Rejected = u32(int64(d.Rejected) + denied)
				if !a.Rule.Shadow {
					refs = append(refs, windowRef{bucket: k, delta: di})
				}
			}
		}
	}
	st.mu.Unlock()

	// Charge (retried under the same seq: a replay changes nothing).
	failed := false
	if len(b.Deltas) > 0 {
		var out *storeOutcome
		var err error
		for attempt := 0; attempt < 3; attempt++ {
			out, err = st.sync(ctx, &b)
			if err == nil {
				break
			}
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
			}
		}
		if err != nil {
			failed = true
			st.s.m.reports.WithLabelValues("failed").Inc()
			st.s.log.Warn("rlqs: report not charged, Envoy keeps its assignment until its TTL", "node", st.node, "deltas", len(b.Deltas), "err", err)
		} else {
			st.s.m.reports.WithLabelValues("ok").Inc()
			st.mu.Lock()
			st.cfg = cfg
			// What the Envoy may take at once is bounded by its share of what the global
			// bucket still holds (burstOf); a bucket short of one permit a node denies
			// until it has refilled that much.
			burst := map[string]int64{}
			demands := map[string]demand{} // per bucket, read once: every window shares it
			demandOf := func(k string) demand {
				d, ok := demands[k]
				if !ok {
					d = st.s.demand(k, st, now)
					demands[k] = d
				}
				return d
			}
			for _, r := range refs {
				p := lease.ParamsOf(&b.Deltas[r.delta])
				d := demandOf(r.bucket)
				sta := out.states[r.delta]
				if sta.Flags&wire.StateRefused != 0 {
					continue
				}
				n := int64(len(d.others) + 1)
				m := burstOf(sta.Remaining, d.burstPortion(p), n)
				if old, ok := burst[r.bucket]; !ok || m < old {
					burst[r.bucket] = m
				}
				if m > 0 {
					continue
				}
				// Until the bucket has refilled a permit for each Envoy on the key.
				wait := lease.RefillUs(p, now, n-sta.Remaining)
				wait = min(max(wait, 1_000_000), st.s.o.ReportInterval.Microseconds())
				if bk := st.buckets[r.bucket]; bk != nil && now+wait > bk.denyUntilUs {
					bk.denyUntilUs = now + wait
				}
			}
			for k, m := range burst {
				if bk := st.buckets[k]; bk != nil {
					bk.burst = m
					bk.dem = st.settle(bk, demandOf(k))
					if m > 0 {
						bk.denyUntilUs = 0 // the bucket holds its share again (or Redis is back)
					}
				}
			}
			st.mu.Unlock()
		}
	} else {
		st.s.m.reports.WithLabelValues("ok").Inc()
		st.mu.Lock()
		st.cfg = cfg
		st.mu.Unlock()
	}
	if failed {
		// Redis did not take the report: a bucket a fail-closed rule limits is denied
		// until a report is charged again (at most a TTL); the others get no answer, so
		// the Envoy's assignment stands until its TTL and then its
		// expired_assignment_behavior decides (fail open).
		var closed []string
		st.mu.Lock()
		for _, k := range order {
			if bk := st.buckets[k]; bk != nil && failClosed(cfg, st.domain, bk.entries) {
				bk.denyUntilUs = now + (2*st.s.o.ReportInterval + time.Second).Microseconds()
				closed = append(closed, k)
			}
		}
		st.mu.Unlock()
		st.push(closed, "fail_closed", true)
		return
	}
	st.push(order, "report", true)
}

// failClosed reports whether a rule with "fail": "closed" (not shadow) selects the
// bucket of entries.
func failClosed(cfg *rule.Config, domain string, entries []rule.DescriptorEntry) bool {
	if cfg == nil || cfg.Off() {
		return false
	}
	for _, a := range cfg.ApplyDescriptor(domain, entries, nil) {
		if a.Rule.Fail == rule.FailClosed && !a.Rule.Shadow {
			return true
		}
	}
	return false
}

// storeOutcome is what a report needs of the store's answer.
type storeOutcome struct {
	nodes  uint32
	states []wire.State
}

func (st *stream) sync(ctx context.Context, b *wire.Batch) (*storeOutcome, error) {
	out, err := st.s.svc.Sync(ctx, "rlqs", b, false)
	if err != nil {
		return nil, err
	}
	if len(out.States) != len(b.Deltas) {
		return nil, fmt.Errorf("rlqs: store answered %d states for %d deltas", len(out.States), len(b.Deltas))
	}
	return &storeOutcome{nodes: out.Nodes, states: out.States}, nil
}

// push sends the actions of buckets keys (all of them when always, else only those that
// changed).
func (st *stream) push(keys []string, reason string, always bool) {
	now := nowUs()
	st.mu.Lock()
	resp := &rlqsv3.RateLimitQuotaResponse{}
	for _, k := range keys {
		bk := st.buckets[k]
		if bk == nil {
			continue
		}
		a, action := st.action(bk, now)
		if !always && a == bk.sent {
			continue
		}
		if st.s.log.Enabled(context.Background(), slog.LevelDebug) {
			st.s.log.Debug("rlqs: assignment", "reason", reason, "node", st.node, "demand", bk.dem, "burst", bk.burst, "was", bk.sent, "now", a)
		}
		bk.sent = a
		if a.kind == 1 {
			st.s.m.buckets.WithLabelValues("unmatched").Inc()
		}
		resp.BucketAction = append(resp.BucketAction, action)
	}
	st.mu.Unlock()
	st.send(resp, reason)
}

func (st *stream) send(resp *rlqsv3.RateLimitQuotaResponse, reason string) {
	if len(resp.BucketAction) == 0 {
		return
	}
	st.sendMu.Lock()
	err := st.ss.Send(resp)
	st.sendMu.Unlock()
	if err != nil {
		st.s.log.Debug("rlqs: send failed", "node", st.node, "err", err)
		return
	}
	st.s.m.pushes.WithLabelValues(reason).Add(float64(len(resp.BucketAction)))
}

// windows are the parameters of every window the rule set limits bucket bk by (shadow
// rules left out: they never refuse) (st.mu held).
func (st *stream) windows(bk *bucket) []algo.Params {
	if st.cfg == nil || st.cfg.Off() {
		return nil
	}
	var out []algo.Params
	for _, ap := range st.cfg.ApplyDescriptor(st.domain, bk.entries, nil) {
		if !ap.Rule.Shadow {
			out = append(out, ap.Windows...)
		}
	}
	return out
}

// settle is the demand bk's assignment follows once the Envoys' demand on its key is d:
// d when Envoys joined or left the key, or when it moves this Envoy's portion of some
// window by more than a quarter; else the one it follows now. Counts of a slow key are
// noisy (2 or 3 requests in a report), and Envoy 1.40 builds a new token bucket for
// every changed assignment; following each count refused an even client at 90 % of its
// limit 15 % of the time, where an assignment that holds refused none (st.mu held).
func (st *stream) settle(bk *bucket, d demand) demand {
	if bk.sent.kind != 3 || len(d.others) != len(bk.dem.others) {
		return d
	}
	for _, p := range st.windows(bk) {
		was, now := bk.dem.portion(p), d.portion(p)
		if 4*absDiff(now.w, was.w) > was.w {
			return d
		}
	}
	return bk.dem
}

func absDiff(a, b int64) int64 { return max(a-b, b-a) }

// shrunk is bk's burst cap once the demand on its key is d: scaled down by the largest
// fall of this Envoy's burst portion over its windows, so a burst granted under a larger share
// is not pushed again under a smaller one; never raised (a report raises it, from what
// the global bucket holds) (st.mu held).
func (st *stream) shrunk(bk *bucket, d demand) int64 {
	burst := bk.burst
	for _, p := range st.windows(bk) {
		was, now := bk.dem.burstPortion(p), d.burstPortion(p)
		if now.w < was.w { // both of portionScale
			burst = min(burst, portion{now.w, was.w}.of(bk.burst))
		}
	}
	return burst
}

// action is bucket bk's assignment now (st.mu held).
func (st *stream) action(bk *bucket, now int64) (assignment, *rlqsv3.RateLimitQuotaResponse_BucketAction) {
	ttl := 2*st.s.o.ReportInterval + time.Second
	var a assignment
	var shares []share
	for _, p := range st.windows(bk) {
		shares = append(shares, shareOf(p, bk.dem.portion(p), bk.dem.burstPortion(p)))
	}
	strategy := &typev3.RateLimitStrategy{}
	switch sh, ok := tightest(shares); {
	case !ok:
		// No rule limits this bucket: nothing to enforce.
		a.kind = 1
		strategy.Strategy = &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}
	case bk.denyUntilUs > now:
		a.kind = 2
		strategy.Strategy = &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}
		// Envoy reads whole seconds of the TTL; the heartbeat lifts the deny on time.
		ttl = time.Duration((bk.denyUntilUs-now+999_999)/1_000_000) * time.Second
	default:
		if bk.burst >= 0 && int64(sh.MaxTokens) > bk.burst {
			// Lifted from a deny (burst 0) the bucket starts with one permit and the rate.
			sh.MaxTokens = u32(max(bk.burst, 1))
		}
		a.kind, a.share = 3, sh
		strategy.Strategy = &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
			MaxTokens: sh.MaxTokens, TokensPerFill: wrapperspb.UInt32(sh.TokensPerFill), FillInterval: durationpb.New(time.Duration(sh.FillSec) * time.Second)}}
	}
	return a, &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: bk.id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(ttl), RateLimitStrategy: strategy}},
	}
}

// heartbeat keeps the stream counted in the fleet between reports and pushes what
// changed: the share (fleet size, rule set), a deny whose time is over, and abandons
// idle buckets.
func (st *stream) heartbeat() {
	t := time.NewTicker(st.s.o.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-st.quit:
			return
		case <-st.ss.Context().Done():
			return
		case <-t.C:
		}
		ctx := st.ss.Context()
		hb := wire.Batch{Node: st.node}
		_, err := st.s.svc.Sync(ctx, "rlqs", &hb, false)
		cfg := st.s.svc.RuleSet(ctx)
		now := nowUs()
		st.mu.Lock()
		reason := "change"
		if err != nil {
			st.s.log.Debug("rlqs: heartbeat failed", "node", st.node, "err", err)
		}
		if cfg != st.cfg {
			st.cfg = cfg
		}
		var keys []string
		abandon := &rlqsv3.RateLimitQuotaResponse{}
		for k, bk := range st.buckets {
			if now-bk.usedUs > st.s.o.IdleAfter.Microseconds() {
				delete(st.buckets, k)
				abandon.BucketAction = append(abandon.BucketAction, &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: bk.id,
					BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}})
				continue
			}
			if d := st.settle(bk, st.s.demand(k, st, now)); !d.equal(bk.dem) {
				// Another Envoy joined or left the key: the share changes. A burst already
				// granted shrinks with a smaller portion, so the pushed share holds no more
				// than the global bucket backed.
				if bk.burst > 0 {
					bk.burst = st.shrunk(bk, d)
				}
				bk.dem = d
			}
			keys = append(keys, k)
		}
		st.mu.Unlock()
		st.send(abandon, "abandon")
		st.push(keys, reason, false)
	}
}

// expireAll sends a TTL-0 assignment for every bucket (the service stops).
func (st *stream) expireAll() {
	now := nowUs()
	st.mu.Lock()
	resp := &rlqsv3.RateLimitQuotaResponse{}
	for _, bk := range st.buckets {
		_, action := st.action(bk, now)
		action.GetQuotaAssignmentAction().AssignmentTimeToLive = durationpb.New(0)
		resp.BucketAction = append(resp.BucketAction, action)
	}
	st.mu.Unlock()
	st.send(resp, "shutdown")
}

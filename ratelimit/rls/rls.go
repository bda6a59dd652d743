// Package rls is Envoy's rate limit service (envoy.service.ratelimit.v3.RateLimitService,
// the gRPC API of Envoy's native envoy.filters.http.ratelimit filter) on Tollgate's
// quotas. A request's descriptors select the rules whose descriptor match they fit
// (rule.Config.ApplyDescriptor), and each selected window is decided on the same Redis
// buckets, keyed by rule id, caller key, tier and window, that the Wasm filter charges:
// from leases the replica holds in memory, as a gateway decides (leases.go), or, for
// strict rules and with leases off, as a strict check through the sync service's check
// path (service.Check). A fleet may mix both filters on one quota, whichever way a
// request arrives.
//
// It authenticates like the sync endpoints (the sync secret as "authorization: Bearer
// <secret>" in the call's metadata, or nothing with --insecure), answers every
// descriptor with its most restrictive window (limit, remaining, time until reset) and
// adds the RateLimit headers the Wasm filter sends, so Envoy forwards them. Shadow rules
// are charged but never refuse; while Redis is unreachable a rule's fail mode decides
// (open: OK with x-ratelimit-policy: degraded; closed: OVER_LIMIT); penalties are the
// store's, as for every node of the fleet.
package rls

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tollgate-rl/tollgate/ratelimit/service"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/rule"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Bounds of one request. What a client controls (descriptor values built from its
// headers, hits_addend where a route takes it from the request) never makes the call
// fail: an error answer lets Envoy's failure_mode_deny: false admit the request with no
// limit at all. So a value of any length is matched and keyed (a caller key longer than
// rule.MaxKeyLen is limited under its shortened form, a prefix and a hash of the whole
// value), an empty value is a value (emptyValueKey), hits_addend above algo.MaxCost is
// clamped to it (counted), and a request of more than MaxDescriptors descriptors is
// answered OVER_LIMIT without deciding any (counted). Only what Envoy's configuration
// decides (the domain, is_negative_hits) is refused with INVALID_ARGUMENT.
const (
	MaxDescriptors = 64
	// MaxMessageSize bounds one request: 64 descriptors carrying a 60 KiB header value
	// each (Envoy's default max_request_headers_kb is 60) fit.
	MaxMessageSize = 4 << 20
	maxText        = 256 // domain
)

// emptyValueKey stands for an empty descriptor value (a header sent empty): such a
// value is limited as one caller of its own, as envoyproxy/ratelimit does, instead of
// selecting no rule (which let an empty x-api-key through unlimited). A header value
// cannot contain NUL, so no caller's value shares this key.
const emptyValueKey = "\x00"

// Node is the node id the service's checks carry with leases off: the store counts it
// among the nodes (one more in the fleet size, whatever the number of instances), which
// only makes the gateways' cold-start allowances a little more conservative. With
// leases each replica has a node id of its own (LeaseOptions.Node).
const Node = "tollgate-rls"

// Server answers ShouldRateLimit. Create with New, serve with GRPCServer.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	svc *service.Service
	log *slog.Logger
	m   *metrics
	seq atomic.Uint64
	// leases decide from leases held in memory (nil: every window a strict check).
	leases *leases
	node   string
}

// New builds the server on svc (whose rule set, check path, sync secrets and metrics
// registry it uses). Unless o.Off, it decides from leases and syncs them in the
// background until Close.
func New(svc *service.Service, log *slog.Logger, o LeaseOptions) *Server {
	if log == nil {
		log = slog.Default()
	}
	s := &Server{svc: svc, log: log, m: newMetrics(svc.Metrics().Registry), node: Node}
	s.seq.Store(uint64(time.Now().UnixMicro()))
	if !o.Off {
		s.leases = newLeases(svc, log, s.m, o)
		s.node = s.leases.o.Node
	}
	return s
}

// NodeID is the node id the server's calls to the store carry.
func (s *Server) NodeID() string { return s.node }

// Close stops the lease sync after a last report that gives every lease back.
func (s *Server) Close() {
	if s.leases != nil {
		s.leases.close()
	}
}

// GRPCServer returns a gRPC server with the service registered behind the sync
// authentication and the message-size bound; opts are added (TLS credentials, for
// mTLS).
func (s *Server) GRPCServer(opts ...grpc.ServerOption) *grpc.Server {
	opts = append([]grpc.ServerOption{
		grpc.UnaryInterceptor(s.authenticate),
		grpc.StreamInterceptor(s.authenticateStream),
		grpc.MaxRecvMsgSize(MaxMessageSize),
	}, opts...)
	g := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(g, s)
	return g
}

func (s *Server) authorized(ctx context.Context) bool {
	var auth string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			auth = v[0]
		}
	}
	return s.svc.SyncAuthorized(auth)
}

var errUnauthenticated = status.Error(codes.Unauthenticated, "missing or wrong sync secret (metadata authorization: Bearer <secret>)")

func (s *Server) authenticate(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if !s.authorized(ctx) {
		s.m.requests.WithLabelValues("unauthenticated").Inc()
		return nil, errUnauthenticated
	}
	return h(ctx, req)
}

func (s *Server) authenticateStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if !s.authorized(ss.Context()) {
		s.m.requests.WithLabelValues("unauthenticated").Inc()
		return errUnauthenticated
	}
	return h(srv, ss)
}

// check is one window of one rule that one or more descriptors selected.
type check struct {
	delta int // index into the batch
	ai    int // index into the applied rules
	w     int
	prm   algo.Params
}

// ShouldRateLimit decides a request's descriptors.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	resp, code, err := s.decide(ctx, req, start)
	s.m.requests.WithLabelValues(code).Inc()
	s.m.seconds.Observe(time.Since(start).Seconds())
	return resp, err
}

func (s *Server) decide(ctx context.Context, req *rlsv3.RateLimitRequest, now time.Time) (*rlsv3.RateLimitResponse, string, error) {
	if err := validate(req); err != nil {
		return nil, "invalid", status.Error(codes.InvalidArgument, err.Error())
	}
	if len(req.Descriptors) > MaxDescriptors {
		return s.tooMany(req), "too_many_descriptors", nil
	}
	cfg := s.svc.RuleSet(ctx)
	b := wire.Batch{Node: s.node, Seq: s.seq.Add(1)}
	type bucket struct {
		key, rule, tier string
		w               int
	}
	index := map[bucket]int{}
	perDesc := make([][]check, len(req.Descriptors))
	var first []int // the applied rule that made each delta
	entries := make([]rule.DescriptorEntry, 0, 8)
	var applied []rule.Applied
	ends := make([]int, len(req.Descriptors)) // applied[ends[i-1]:ends[i]] are descriptor i's
	for i, d := range req.Descriptors {
		entries = entries[:0]
		for _, e := range d.Entries {
			v := e.Value
			if v == "" {
				v = emptyValueKey
			}
			entries = append(entries, rule.DescriptorEntry{Key: e.Key, Value: v})
		}
		start := len(applied)
		if !cfg.Off() { // enforcement off: no rule applies, every descriptor is OK
			applied = cfg.ApplyDescriptor(req.Domain, entries, applied)
		}
		cost, clamped := hits(req, i)
		if clamped {
			s.m.clamped.Inc()
		}
		for j := start; j < len(applied); j++ {
			if cost > 0 {
				applied[j].Cost = cost
			}
		}
		ends[i] = len(applied)
	}
	replaced := replacedRules(applied)
	for i := range req.Descriptors {
		start := 0
		if i > 0 {
			start = ends[i-1]
		}
		perDesc[i] = make([]check, 0, ends[i]-start)
		for j := start; j < ends[i]; j++ {
			a := &applied[j]
			if replaced[a.Rule.ID] {
				continue
			}
			for w, prm := range a.Windows {
				k := bucket{a.Key, a.Rule.ID, a.Tier, w}
				di, seen := index[k]
				if !seen {
					// One bucket once per batch: descriptors that select the same bucket
					// are charged together.
					di = len(b.Deltas)
					index[k] = di
					first = append(first, j)
					b.Deltas = append(b.Deltas, wire.Delta{Key: a.Key, Rule: a.Rule.ID, Tier: a.Tier, Window: uint8(w),
						Flags: wire.FlagStrict, Algo: uint8(prm.Kind), Limit: u32(prm.Limit), WindowMs: u32(prm.WindowUs / 1000), Burst: u32(prm.Burst)})
				}
				b.Deltas[di].Over = u32(int64(b.Deltas[di].Over) + a.Cost)
				perDesc[i] = append(perDesc[i], check{delta: di, ai: j, w: w, prm: prm})
			}
		}
	}
	var out *store.Outcome
	var degraded []bool
	switch {
	case len(b.Deltas) > 0 && s.leases != nil:
		var err error
		out, degraded, err = s.decideLeased(ctx, &b, applied, first, cfg)
		if err != nil {
			return nil, "internal", status.Error(codes.Internal, err.Error())
		}
	case len(b.Deltas) > 0:
		var err error
		out, err = s.svc.Check(ctx, "rls", &b)
		if errors.Is(err, store.ErrInvalid) {
			return nil, "internal", status.Error(codes.Internal, err.Error())
		}
		if err != nil {
			s.log.Warn("rls check failed: rules' fail modes decide", "descriptors", len(req.Descriptors), "deltas", len(b.Deltas), "err", err)
		}
	}
	r := reply{now: now, applied: applied, jitterUs: 1000_000, cfg: cfg, degradedDelta: degraded}
	if cfg != nil {
		r.jitterUs = cfg.RetryJitterMs * 1000
	}
	resp := r.build(perDesc, out, s.m)
	code := "ok"
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		code = "over_limit"
	}
	if r.degraded {
		code += "_degraded"
	}
	return resp, code, nil
}

// replacedRules is the set of rules that the request's selected rules replace
// (descriptors.replaces): they are applied to none of its descriptors, whichever rule
// selected them, and a replaced rule's own replacements still count. nil (the usual
// case) when no selected rule replaces any.
func replacedRules(applied []rule.Applied) map[string]bool {
	var out map[string]bool
	for i := range applied {
		d := applied[i].Rule.Descriptors
		if d == nil || len(d.Replaces) == 0 {
			continue
		}
		if out == nil {
			out = make(map[string]bool, len(d.Replaces))
		}
		for _, id := range d.Replaces {
			out[id] = true
		}
	}
	return out
}

// hits is the cost of descriptor i: its own hits_addend, else the request's, else 0
// (the rule's cost). Zero means "not set", as Envoy sends it. A value above
// algo.MaxCost is clamped to it (clamped true): no bucket admits that much at once, so
// the request is refused as over its limit rather than failing the call.
func hits(req *rlsv3.RateLimitRequest, i int) (cost int64, clamped bool) {
	h := uint64(req.HitsAddend)
	if d := req.Descriptors[i].GetHitsAddend(); d != nil && d.Value > 0 {
		h = d.Value
	}
	if h > uint64(algo.MaxCost) {
		return algo.MaxCost, true
	}
	return int64(h), false
}

// validate refuses what Envoy's configuration, not a client, decides and the service
// does not do: a missing or oversized domain, a refund (is_negative_hits).
func validate(req *rlsv3.RateLimitRequest) error {
	if req.Domain == "" || len(req.Domain) > maxText {
		return errors.New("domain: must be 1.." + strconv.Itoa(maxText) + " bytes")
	}
	for i, d := range req.Descriptors {
		if d.IsNegativeHits {
			// A refund would let any caller with the sync secret give permits back.
			return errors.New("descriptors[" + strconv.Itoa(i) + "].is_negative_hits: not supported")
		}
	}
	return nil
}

// tooMany answers a request of more than MaxDescriptors descriptors: every descriptor
// OVER_LIMIT, nothing decided or charged (Envoy builds one descriptor per rate limit
// action list of a route, a handful; more is not a request the rules were written for).
func (s *Server) tooMany(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.Descriptors))}
	for i := range resp.Statuses {
		resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OVER_LIMIT}
	}
	s.m.descriptors.WithLabelValues("too_many").Add(float64(len(req.Descriptors)))
	return resp
}

func u32(v int64) uint32 { return uint32(min(max(v, 0), 1<<32-1)) }

// jitter draws the Retry-After jitter's randomness.
func jitter() uint64 { return rand.Uint64() }

// decideLeased decides b's deltas on a replica with leases: strict rules' windows (and
// new buckets while the lease table is full) are strict checks in Redis (first: a refusal there decides the call and nothing else is
// charged), the others are decided from the replica's leases (leases.decide). It
// returns each delta's state as the check path would, and which were decided without
// Redis (degraded: the rules' fail modes answer them).
func (s *Server) decideLeased(ctx context.Context, b *wire.Batch, applied []rule.Applied, first []int, cfg *rule.Config) (*store.Outcome, []bool, error) {
	out := &store.Outcome{States: make([]wire.State, len(b.Deltas))}
	degraded := make([]bool, len(b.Deltas))
	var strict []int
	items := make([]item, 0, len(b.Deltas))
	var at []int // delta of each item
	ids := make([]bucketID, len(b.Deltas))
	for i := range b.Deltas {
		d := &b.Deltas[i]
		ids[i] = bucketID{d.Key, d.Rule, d.Tier, d.Window}
	}
	room := s.leases.held(ids)
	for i := range b.Deltas {
		a := &applied[first[i]]
		if !a.Rule.Strict && !room[i] {
			s.m.tableFull.Inc()
		}
		if a.Rule.Strict || !room[i] {
			strict = append(strict, i)
			continue
		}
		d := &b.Deltas[i]
		items = append(items, item{id: ids[i], rule: a.Rule,
			prm: a.Windows[d.Window], cost: int64(d.Over), shadow: cfg.Shadowed(a)})
		at = append(at, i)
	}
	commit := true
	if len(strict) > 0 {
		sb := wire.Batch{Node: b.Node, Seq: b.Seq}
		for _, i := range strict {
			sb.Deltas = append(sb.Deltas, b.Deltas[i])
		}
		so, err := s.svc.Check(ctx, "rls", &sb)
		if errors.Is(err, store.ErrInvalid) {
			return nil, nil, err
		}
		if err != nil {
			s.log.Warn("rls check failed: rules' fail modes decide", "deltas", len(sb.Deltas), "err", err)
		}
		for j, i := range strict {
			if so == nil || j >= len(so.States) {
				continue // unavailable
			}
			st := so.States[j]
			out.States[i] = st
			if st.ServerMs != 0 && st.Flags&wire.StateRefused == 0 && !st.Allowed() && !cfg.Shadowed(&applied[first[i]]) {
				commit = false
			}
		}
	}
	if len(items) > 0 {
		s.leases.decide(ctx, items, commit)
		now := nowUs()
		for j := range items {
			it := &items[j]
			i := at[j]
			switch {
			case it.fromService:
				out.States[i] = it.st
			default:
				out.States[i] = stateOf(&it.dec, now)
				degraded[i] = it.dec.Degraded
			}
		}
	}
	return out, degraded, nil
}

// stateOf is a lease decision as the state a strict check answers (what the reply
// reads). A bucket left undecided (it waits for an acquire while another refused the
// call) shows as admitting: it took nothing and is not why the call is refused.
func stateOf(d *lease.Decision, now int64) wire.State {
	st := wire.State{Remaining: d.Remaining, ResetInMs: ceilMs(d.ResetUs - now), RetryInMs: ceilMs(d.RetryAfterUs),
		PenaltyLevel: d.PenaltyLevel, ServerMs: uint64(max(now/1000, 1))}
	if d.Penalized {
		st.PenaltyInMs = ceilMs(d.PenaltyLeftUs)
	}
	if d.Allowed || d.Acquire {
		st.Flags = wire.StateAllowed
	}
	return st
}

func ceilMs(us int64) uint32 { return u32((us + 999) / 1000) }

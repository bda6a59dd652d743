// Package rls is Envoy's rate limit service (envoy.service.ratelimit.v3.RateLimitService,
// the gRPC API of Envoy's native envoy.filters.http.ratelimit filter) on Tollgate's
// quotas. A request's descriptors select the rules whose descriptor match they fit
// (rule.Config.ApplyDescriptor), and each selected window is decided as a strict check
// through the sync service's check path (service.Check): the same Redis buckets, keyed
// by rule id, caller key, tier and window, that the Wasm filter's leases and strict
// checks charge. A fleet may mix both filters on one quota, whichever way a request
// arrives.
//
// It authenticates like the sync endpoints (the sync secret as "authorization: Bearer
// <secret>" in the call's metadata, or nothing with --insecure), answers every
// descriptor with its most restrictive window (limit, remaining, time until reset) and
// adds the RateLimit headers the Wasm filter sends, so Envoy forwards them. Shadow rules
// are charged but never refuse; while Redis is unreachable a rule's fail mode decides
// (open: OK with x-ratelimit-policy: degraded; closed: OVER_LIMIT); penalties are the
// store's, as for every strict check.
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
	"github.com/tollgate-rl/tollgate/shared/rule"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Bounds of one request: Envoy sends one descriptor per rate limit action list that
// applies to the route, a handful in practice. Anything larger is refused
// (INVALID_ARGUMENT) before any work.
const (
	MaxDescriptors = 64
	MaxEntries     = 16       // entries per descriptor
	MaxMessageSize = 64 << 10 // bytes of one request
	maxText        = 256      // domain, entry key or value
)

// Node is the node id the service's checks carry: the store counts it among the
// gateways that sync (one more node in the fleet size, whatever the number of
// instances), which only makes the gateways' cold-start allowances a little more conservative.
const Node = "tollgate-rls"

// Server answers ShouldRateLimit. Create with New, serve with GRPCServer.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	svc *service.Service
	log *slog.Logger
	m   *metrics
	seq atomic.Uint64
}

// New builds the server on svc (whose rule set, check path, sync secrets and metrics
// registry it uses).
func New(svc *service.Service, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	s := &Server{svc: svc, log: log, m: newMetrics(svc.Metrics().Registry)}
	s.seq.Store(uint64(time.Now().UnixMicro()))
	return s
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
	cfg := s.svc.RuleSet(ctx)
	b := wire.Batch{Node: Node, Seq: s.seq.Add(1)}
	type bucket struct {
		key, rule, tier string
		w               int
	}
	index := map[bucket]int{}
	perDesc := make([][]check, len(req.Descriptors))
	entries := make([]rule.DescriptorEntry, 0, MaxEntries)
	var applied []rule.Applied
	ends := make([]int, len(req.Descriptors)) // applied[ends[i-1]:ends[i]] are descriptor i's
	for i, d := range req.Descriptors {
		entries = entries[:0]
		for _, e := range d.Entries {
			entries = append(entries, rule.DescriptorEntry{Key: e.Key, Value: e.Value})
		}
		start := len(applied)
		if !cfg.Off() { // enforcement off: no rule applies, every descriptor is OK
			applied = cfg.ApplyDescriptor(req.Domain, entries, applied)
		}
		cost := hits(req, i)
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
					b.Deltas = append(b.Deltas, wire.Delta{Key: a.Key, Rule: a.Rule.ID, Tier: a.Tier, Window: uint8(w),
						Flags: wire.FlagStrict, Algo: uint8(prm.Kind), Limit: u32(prm.Limit), WindowMs: u32(prm.WindowUs / 1000), Burst: u32(prm.Burst)})
				}
				b.Deltas[di].Over = u32(int64(b.Deltas[di].Over) + a.Cost)
				perDesc[i] = append(perDesc[i], check{delta: di, ai: j, w: w, prm: prm})
			}
		}
	}
	var out *store.Outcome
	if len(b.Deltas) > 0 {
		var err error
		out, err = s.svc.Check(ctx, "rls", &b)
		if errors.Is(err, store.ErrInvalid) {
			return nil, "internal", status.Error(codes.Internal, err.Error())
		}
		if err != nil {
			s.log.Warn("rls check failed: rules' fail modes decide", "descriptors", len(req.Descriptors), "deltas", len(b.Deltas), "err", err)
		}
	}
	r := reply{now: now, applied: applied, jitterUs: 1000_000, cfg: cfg}
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
// (the rule's cost). Zero means "not set", as Envoy sends it.
func hits(req *rlsv3.RateLimitRequest, i int) int64 {
	if h := req.Descriptors[i].GetHitsAddend(); h != nil && h.Value > 0 {
		return int64(h.Value)
	}
	return int64(req.HitsAddend)
}

// validate bounds a request and refuses what the service does not do.
func validate(req *rlsv3.RateLimitRequest) error {
	if req.Domain == "" || len(req.Domain) > maxText {
		return errors.New("domain: must be 1.." + strconv.Itoa(maxText) + " bytes")
	}
	if len(req.Descriptors) > MaxDescriptors {
		return errors.New("descriptors: " + strconv.Itoa(len(req.Descriptors)) + " descriptors, at most " + strconv.Itoa(MaxDescriptors))
	}
	if int64(req.HitsAddend) > algo.MaxCost {
		return errors.New("hits_addend: " + strconv.FormatUint(uint64(req.HitsAddend), 10) + " is more than " + strconv.FormatInt(algo.MaxCost, 10))
	}
	for i, d := range req.Descriptors {
		at := "descriptors[" + strconv.Itoa(i) + "]"
		if len(d.Entries) > MaxEntries {
			return errors.New(at + ".entries: " + strconv.Itoa(len(d.Entries)) + " entries, at most " + strconv.Itoa(MaxEntries))
		}
		for j, e := range d.Entries {
			if len(e.Key) > maxText || len(e.Value) > maxText {
				return errors.New(at + ".entries[" + strconv.Itoa(j) + "]: key and value must be at most " + strconv.Itoa(maxText) + " bytes")
			}
		}
		if d.IsNegativeHits {
			// A refund would let any caller with the sync secret give permits back.
			return errors.New(at + ".is_negative_hits: not supported")
		}
		if h := d.GetHitsAddend(); h != nil && h.Value > uint64(algo.MaxCost) {
			return errors.New(at + ".hits_addend: " + strconv.FormatUint(h.Value, 10) + " is more than " + strconv.FormatInt(algo.MaxCost, 10))
		}
	}
	return nil
}

func u32(v int64) uint32 { return uint32(min(max(v, 0), 1<<32-1)) }

// jitter draws the Retry-After jitter's randomness.
func jitter() uint64 { return rand.Uint64() }

// Package service is the sync service's HTTP API: gateways POST their consumed deltas to
// /v1/sync (and strict checks to /v1/check) in the binary wire format and fetch rule sets
// from /v1/sync/rules; operators manage rule-set versions, allow/deny lists and caller
// keys through a small JSON admin API. Decisions live in Redis (package store) and rule
// sets in Redis too (package rulestore), so any number of instances can run behind one
// load balancer with no state of their own.
package service

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tollgate-rl/tollgate/internal/backend"
	"github.com/tollgate-rl/tollgate/ratelimit/rulestore"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/ratelimit/top"
	"github.com/tollgate-rl/tollgate/shared/keyhash"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Config configures the HTTP API.
type Config struct {
	// SyncSecret is the master secret gateways' node tokens are derived from (NodeToken):
	// a gateway sends "Authorization: Bearer <its node token>" and may sync only as that
	// node. Empty: the sync endpoints answer 401 to everyone, unless Insecure is set or
	// a mesh peer is recognised (Mesh). SetSyncSecrets replaces it (and may accept
	// several during a rotation).
	SyncSecret string
	// NodeTokensOnly refuses the master secret itself as a gateway's credential. Without
	// it a gateway that sends the master secret (the previous release's shared-secret
	// mode, kept for upgrades) is accepted as any node it names, and counted in
	// tollgate_sync_auth_total{mode="shared_secret"}.
	NodeTokensOnly bool
	// Mesh recognises gateways by their mTLS identity (Istio: the SPIFFE id in the
	// x-forwarded-client-cert header the service's sidecar sets).
	Mesh MeshIdentity
	// Insecure opens the sync endpoints to any caller while no sync secret is set (a
	// mesh whose mTLS and network policy already authenticate gateways). It must be
	// asked for: without it a missing secret locks the sync API, it does not open it.
	Insecure bool
	// AdminToken authenticates the admin API. Empty: the admin API answers 401.
	// SetAdminTokens replaces it.
	AdminToken string
	// BatchTimeout bounds applying one batch, failures included. Default:
	// (MaxRetries+1) × the store's AttemptBudget.
	BatchTimeout time.Duration
	Logger       *slog.Logger
	// KeyHashSecret, when set, makes the service store caller keys as keyed hashes
	// (HashKey) in Redis and its logs, as the rule set's key_hashing says (default: IP
	// keys). Changing it starts every hashed bucket afresh.
	KeyHashSecret []byte
	// Top configures the hot-key lists behind GET /v1/top (package top); its Hash is
	// always KeyHash.
	Top top.Config
	// Policy, when set, is the source of truth for rules (package rulestore/postgres):
	// changes are committed there first and refused (503) while it is unavailable; the
	// service keeps Redis holding its active version. Nil: Redis alone.
	Policy PolicyStore
	// PolicyPoll is how often the active version is also read from the policy store,
	// besides LISTEN/NOTIFY (default 5 s): a notification connection that died silently
	// is the only way one is missed.
	PolicyPoll time.Duration
}

// RulesVersionHeader carries the rule-set version on rule responses.
const RulesVersionHeader = "X-Tollgate-Rules-Version"

// ActorHeader names who makes an admin change, for the audit log.
const ActorHeader = "X-Tollgate-Actor"

// Service is the HTTP API. Create with New, serve Handler, and Run its background work.
type Service struct {
	cfg Config
	// be applies the gateways' batches (/v1/sync, /v1/check, Check, Sync, heartbeats):
	// the service needs nothing else of its backend there (internal/backend).
	be backend.Backend
	// st is the same store, for what only Redis does: usage and reset (admin API), and
	// its client, which the rule sets and hot-key lists share.
	st      *store.Store
	rules   *rulestore.Redis
	watcher *rulestore.Watcher
	pol     *durable // nil without a policy store
	alive   aliveCache
	m       *Metrics
	log     *slog.Logger
	mux     *http.ServeMux
	bufs    sync.Pool
	rc      ruleCache
	top     *top.Tracker

	// syncSecrets and adminTokens are read on every request and replaced on a secrets
	// reload (SIGHUP) without a restart.
	syncSecrets atomic.Pointer[[]string]
	adminTokens atomic.Pointer[[]string]

	syncMux, adminMux *http.ServeMux
}

// New builds the service on st. m must be the Metrics st reports to (nil: new ones,
// without the store's Redis metrics).
func New(cfg Config, st *store.Store, m *Metrics) *Service {
	if m == nil {
		m = NewMetrics()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	sc := st.Config()
	if cfg.BatchTimeout <= 0 {
		cfg.BatchTimeout = time.Duration(sc.MaxRetries+1) * sc.AttemptBudget()
	}
	s := &Service{cfg: cfg, be: st, st: st, rules: rulestore.NewRedis(st.Client()), m: m, log: cfg.Logger,
		mux: http.NewServeMux(), syncMux: http.NewServeMux(), adminMux: http.NewServeMux()}
	if cfg.Policy != nil {
		s.pol = &durable{pol: cfg.Policy}
		if s.cfg.PolicyPoll <= 0 {
			s.cfg.PolicyPoll = 5 * time.Second
		}
	}
	s.SetSyncSecrets(cfg.SyncSecret)
	s.SetAdminTokens(cfg.AdminToken)
	cfg.Top.Hash = s.logKey
	s.top = top.New(st.Client(), cfg.Top)
	if cfg.Top.RawKeys {
		s.log.Warn("top lists store and answer raw caller keys (personal data): /v1/top shows them to admin callers")
	}
	s.watcher = rulestore.NewWatcher(s.rules, func(v uint64) {
		m.rulesVersion.Set(float64(v))
		s.log.Info("rules version", "version", v)
	})
	s.bufs.New = func() any { b := make([]byte, 0, 64<<10); return &b }
	switch {
	case cfg.SyncSecret == "" && cfg.Mesh.Enabled:
		s.log.Info("gateways authenticate by their mTLS identity (x-forwarded-client-cert from a trusted proxy); no node tokens")
	case cfg.SyncSecret == "" && cfg.Insecure:
		s.log.Error("INSECURE: no sync secret and insecure mode: /v1/sync, /v1/check and /v1/sync/rules accept any caller")
	case cfg.SyncSecret == "":
		s.log.Warn("no sync secret configured: /v1/sync, /v1/check and /v1/sync/rules answer 401 to every caller")
	}
	m.insecure.Set(0)
	if cfg.Insecure {
		m.insecure.Set(1)
	}
	s.routes()
	return s
}

// Handler serves every endpoint on one listener (tests, and deployments that separate
// nothing by port).
func (s *Service) Handler() http.Handler { return s.mux }

// SyncHandler serves the gateways' endpoints (/v1/sync, /v1/check, /v1/sync/rules) and
// /healthz, /readyz, /metrics; the admin API is not on it, so a network policy that lets
// gateways reach this port does not expose rule changes or usage.
func (s *Service) SyncHandler() http.Handler { return s.syncMux }

// AdminHandler serves the admin API (/v1/rules, /v1/lists, /v1/usage, /v1/reset, /v1/top) and
// /healthz, /readyz, /metrics.
func (s *Service) AdminHandler() http.Handler { return s.adminMux }

// SetSyncSecrets replaces the accepted sync secrets (empty strings are ignored). Several
// are accepted at once during a rotation: add the new one, move the gateways, drop the
// old one.
func (s *Service) SetSyncSecrets(secrets ...string) { s.syncSecrets.Store(nonEmpty(secrets)) }

// SetAdminTokens replaces the accepted admin tokens (empty strings are ignored).
func (s *Service) SetAdminTokens(tokens ...string) { s.adminTokens.Store(nonEmpty(tokens)) }

func nonEmpty(in []string) *[]string {
	out := make([]string, 0, len(in))
	for _, v := range in {
		if v != "" {
			out = append(out, v)
		}
	}
	return &out
}

// Metrics returns the service's metrics.
func (s *Service) Metrics() *Metrics { return s.m }

// Watcher returns the rules-version watcher (tests use it to wait for propagation).
func (s *Service) Watcher() *rulestore.Watcher { return s.watcher }

// BatchTimeout is the effective per-batch deadline.
func (s *Service) BatchTimeout() time.Duration { return s.cfg.BatchTimeout }

// Top returns the hot-key tracker.
func (s *Service) Top() *top.Tracker { return s.top }

// Run keeps the rules version current (pub/sub plus polling) and flushes the hot-key
// counts to Redis until ctx ends.
func (s *Service) Run(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.top.Run(ctx, func(err error) {
			s.m.redisErrors.WithLabelValues("top").Inc()
			s.log.Warn("top-key flush failed", "err", err)
		})
	}()
	pctx, cancel := context.WithTimeout(ctx, s.cfg.BatchTimeout)
	if s.watcher.Poll(pctx) == nil {
		_, _ = s.watcher.Current(pctx) // the body too, so a wipe of Redis finds it here
	}
	cancel()
	kdone := make(chan struct{})
	go func() { defer close(kdone); s.keepRules(ctx) }()
	defer func() { <-kdone }()
	if s.pol != nil {
		pdone := make(chan struct{})
		go func() { defer close(pdone); s.runPolicy(ctx) }()
		defer func() { <-pdone }()
	}
	s.watcher.Run(ctx)
	<-done
}

func (s *Service) routes() {
	sync := map[string]http.Handler{
		"POST /v1/sync":         s.handleBatch("sync", false),
		"POST /v1/check":        s.handleBatch("check", true),
		"GET /v1/sync/rules":    http.HandlerFunc(s.handleSyncRules),
		"GET " + wire.AlivePath: http.HandlerFunc(s.handleAlive),
	}
	admin := map[string]http.Handler{
		"GET /v1/rules":                     s.admin(s.handleGetRules),
		"PUT /v1/rules":                     s.admin(s.handlePutRules),
		"GET /v1/rules/versions":            s.admin(s.handleVersions),
		"POST /v1/rules/rollback/{version}": s.admin(s.handleRollback),
		"GET /v1/lists/{list}":              s.admin(s.handleGetList),
		"PUT /v1/lists/{list}":              s.admin(s.handleEditList(true)),
		"DELETE /v1/lists/{list}":           s.admin(s.handleEditList(false)),
		"GET /v1/usage/{key...}":            s.admin(s.handleUsage),
		"POST /v1/reset/{key...}":           s.admin(s.handleReset),
		"GET /v1/top":                       s.admin(s.handleTop),
	}
	// Health and metrics on both listeners: a probe or a scraper reaches whichever port
	// its network policy allows, and they reveal no caller data.
	open := map[string]http.Handler{
		"GET /healthz": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok\n") }),
		"GET /readyz":  http.HandlerFunc(s.handleReady),
		"GET /metrics": promhttp.HandlerFor(s.m.Registry, promhttp.HandlerOpts{}),
	}
	for _, g := range []struct {
		routes map[string]http.Handler
		muxes  []*http.ServeMux
	}{
		{sync, []*http.ServeMux{s.mux, s.syncMux}},
		{admin, []*http.ServeMux{s.mux, s.adminMux}},
		{open, []*http.ServeMux{s.mux, s.syncMux, s.adminMux}},
	} {
		for pattern, h := range g.routes {
			for _, mux := range g.muxes {
				mux.Handle(pattern, h)
			}
		}
	}
}

// bearer checks "Authorization: Bearer <token>" against the accepted tokens in constant
// time (per token). An empty token never matches, whatever is configured.
func bearer(r *http.Request, accepted *[]string) bool {
	return bearerValue(r.Header.Get("Authorization"), accepted)
}

// bearerValue checks an Authorization value ("Bearer <token>") as bearer does.
func bearerValue(authorization string, accepted *[]string) bool {
	got, ok := strings.CutPrefix(authorization, "Bearer ")
	if !ok || got == "" || accepted == nil {
		return false
	}
	match := 0
	for _, want := range *accepted {
		match |= subtle.ConstantTimeCompare([]byte(got), []byte(want))
	}
	return match == 1
}

// syncAuthorized authenticates a sync-API request (authenticate) and counts it.
func (s *Service) syncAuthorized(r *http.Request) (identity, bool) {
	id, ok := s.authenticate(r)
	if ok {
		s.m.fleetx.auth.WithLabelValues(id.mode).Inc()
	}
	return id, ok
}

// SyncAuthorized applies the sync endpoints' bearer authentication to an Authorization
// value ("Bearer <credential>") that arrived another way (gRPC metadata): any node's
// token, the master secret unless NodeTokensOnly, or anything while no secret is set
// and the service runs insecure on purpose. Checks carry no sequence to protect, so any
// node's credential will do.
func (s *Service) SyncAuthorized(authorization string) bool {
	id, ok := s.authenticateBearer(authorization)
	if ok {
		s.m.fleetx.auth.WithLabelValues(id.mode).Inc()
	}
	return ok
}

func (s *Service) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !bearer(r, s.adminTokens.Load()) {
			s.m.error("auth")
			w.Header().Set("WWW-Authenticate", `Bearer realm="tollgate-admin"`)
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "missing or wrong admin token"})
			return
		}
		h(w, r)
	}
}

// handleBatch serves /v1/sync and /v1/check. /v1/sync applies a gateway's batch exactly
// once (a resent batch is answered from the idempotency records); /v1/check decides
// strict rules and acquires (paused requests) once, without recording them: a gateway
// never resends those. Batches of the previous protocol version are answered in that
// version, without leases (ratelimit/README.md, "Upgrades").
func (s *Service) handleBatch(endpoint string, check bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		outcome := "ok"
		defer func() {
			s.m.batches.WithLabelValues(endpoint, outcome).Inc()
			s.m.batchSeconds.WithLabelValues(endpoint).Observe(time.Since(start).Seconds())
		}()
		fail := func(code int, kind, msg string) {
			outcome = kind
			s.m.error(kind)
			http.Error(w, msg, code)
		}
		id, authed := s.syncAuthorized(r)
		if !authed {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tollgate-sync"`)
			fail(http.StatusUnauthorized, "unauthorized", "missing or wrong sync credential")
			return
		}
		if r.ContentLength > wire.MaxBatchSize {
			fail(http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("batch of %d bytes exceeds %d", r.ContentLength, wire.MaxBatchSize))
			return
		}
		bp := s.bufs.Get().(*[]byte)
		defer s.bufs.Put(bp)
		body, err := readAll(http.MaxBytesReader(w, r.Body, wire.MaxBatchSize), (*bp)[:0])
		*bp = body[:0]
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				fail(http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("batch exceeds %d bytes", wire.MaxBatchSize))
				return
			}
			fail(http.StatusBadRequest, "decode", "reading body: "+err.Error())
			return
		}
		var b wire.Batch
		v1 := wire.PeekVersion(body) == wire.VersionV1
		if v1 {
			err = decodeV1(body, &b)
		} else {
			err = wire.DecodeBatch(body, &b)
		}
		if err != nil {
			if errors.Is(err, wire.ErrLimit) {
				fail(http.StatusRequestEntityTooLarge, "too_large", err.Error())
				return
			}
			fail(http.StatusBadRequest, "decode", err.Error())
			return
		}
		claimed := b.Node
		if v1 {
			if i := strings.LastIndexByte(claimed, '#'); i >= 0 {
				claimed = claimed[:i]
			}
		}
		if why := id.bind(&b, claimed); why != "" {
			fail(http.StatusForbidden, "forbidden", why)
			return
		}
		if !s.rulesReady() {
			w.Header().Set("Retry-After", "1")
			fail(http.StatusServiceUnavailable, "no_rules", errNoRules.Error())
			return
		}
		if why := seqProblem(b.Seq, time.Now()); why != "" && !check {
			fail(http.StatusBadRequest, "invalid", why)
			return
		}
		// What one gateway can do to keys others serve (nodebounds.go): refusal counts
		// are bounded per batch, and a delta that reports nothing is not answered with
		// the bucket's numbers.
		if n := boundRejected(&b); n > 0 {
			s.m.rejectedClamped.Add(float64(n))
		}
		resolve := s.resolver(r.Context())
		refuse := func(d *wire.Delta) string {
			if resolve != nil {
				if why := resolve(d); why != "" {
					return why
				}
			}
			if isRead(d) {
				return readRefusal
			}
			return ""
		}
		opts := backend.Options{Idempotent: !check, NoLease: v1, Refuse: refuse, NoLearn: resolve != nil, StoreKey: s.storeKeyFunc(s.ruleSet(r.Context()))}
		if check {
			for i := range b.Deltas {
				if b.Deltas[i].Flags&(wire.FlagStrict|wire.FlagAcquire) == 0 {
					b.Deltas[i].Flags |= wire.FlagStrict
				}
			}
		}
		// A gateway that hangs up must not cut a batch in half: finish it (bounded).
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.cfg.BatchTimeout)
		var out *backend.Outcome
		err = nil
		if len(b.Deltas) == 0 {
			// A heartbeat needs no Redis command, but its answer tells the gateway the
			// service can vouch for its leases: not while Redis has stalled (alive.go).
			err = s.redisAlive(ctx)
		}
		if err == nil {
			out, err = s.be.Apply(ctx, &b, opts)
		}
		cancel()
		if errors.Is(err, backend.ErrInvalid) {
			fail(http.StatusBadRequest, "invalid", err.Error())
			return
		}
		if err != nil {
			kind := "redis"
			if errors.Is(err, context.DeadlineExceeded) {
				kind = "timeout"
			}
			s.log.Warn("batch failed", "endpoint", endpoint, "node", b.Node, "seq", b.Seq, "deltas", len(b.Deltas), "err", err)
			if out != nil {
				for _, se := range out.ShardErrors {
					s.log.Warn("redis shard failed", "slot", se.Slot, "deltas", se.Deltas, "err", se.Err)
				}
			}
			w.Header().Set("Retry-After", "1")
			fail(http.StatusServiceUnavailable, "unavailable", err.Error())
			s.m.error(kind)
			return
		}
		reads := 0
		for i := range b.Deltas {
			if out.States[i].Reason == readRefusal {
				reads++
			}
		}
		if reads > 0 {
			s.m.readsDropped.WithLabelValues(endpoint).Add(float64(reads))
			if check {
				admitReads(&b, out.States)
			}
		}
		s.m.batch(endpoint, &b, out.Results, out.States)
		s.observeTop(&b, out.Results, out.States)
		s.m.fleet.Set(float64(out.Nodes))
		var enc []byte
		if v1 {
			enc, err = replyV1(body[:0], s.watcher.Version(), out)
		} else {
			reply := wire.Reply{RulesVersion: s.watcher.Version(), ServerTimeUs: out.ServerTimeUs, Nodes: out.Nodes, States: out.States}
			enc, err = wire.AppendReply(body[:0], &reply)
		}
		if err != nil {
			fail(http.StatusInternalServerError, "internal", "encoding reply: "+err.Error())
			return
		}
		*bp = enc[:0]
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(enc)))
		_, _ = w.Write(enc)
	}
}

// decodeV1 reads a batch of the previous protocol as a Version 2 batch. Such a gateway
// keeps one batch sequence per worker, so each worker is its own node for idempotency.
// Its leases were kept by the previous service in records this one does not read, so
// everything it admitted is charged (as Over), and it is granted no lease: it decides
// from its share of the global remaining until it is upgraded.
func decodeV1(body []byte, b *wire.Batch) error {
	var old wire.BatchV1
	if err := wire.DecodeBatchV1(body, &old); err != nil {
		return err
	}
	*b = wire.Batch{Node: old.Node + "#" + strconv.FormatUint(uint64(old.Worker), 10), Seq: old.Seq, RulesVersion: old.RulesVersion}
	if old.Node == "" {
		b.Node = ""
	}
	b.Deltas = make([]wire.Delta, len(old.Deltas))
	for i := range old.Deltas {
		o := &old.Deltas[i]
		d := wire.Delta{Key: o.Key, Rule: o.Rule, Window: o.Window, Rejected: o.Rejected, Early: o.Early,
			Algo: o.Algo, Limit: o.Limit, WindowMs: o.WindowMs, Burst: o.Burst}
		over := uint64(o.Leased) + uint64(o.Over)
		d.Over = uint32(min(over, 1<<32-1))
		if o.Flags&1 != 0 {
			d.Flags |= wire.FlagStrict
			d.Over = o.Over
		}
		if o.Flags&4 != 0 {
			d.Flags |= wire.FlagDegraded
		}
		b.Deltas[i] = d
	}
	return nil
}

// replyV1 answers a previous-protocol batch: its remaining, reset, retry and penalty;
// never a lease.
func replyV1(dst []byte, version uint64, out *backend.Outcome) ([]byte, error) {
	rep := wire.ReplyV1{RulesVersion: version, ServerTimeUs: out.ServerTimeUs, Nodes: out.Nodes, States: make([]wire.StateV1, len(out.States))}
	for i := range out.States {
		st := &out.States[i]
		rep.States[i] = wire.StateV1{Key: st.Key, Rule: st.Rule, Window: st.Window, Allowed: st.Allowed(),
			Remaining: st.Remaining, ResetInMs: st.ResetInMs, RetryInMs: st.RetryInMs,
			PenaltyInMs: st.PenaltyInMs, PenaltyLevel: st.PenaltyLevel}
	}
	return wire.AppendReplyV1(dst, &rep)
}

// readAll reads r into buf's capacity (growing it as needed).
func readAll(r io.Reader, buf []byte) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

func (s *Service) handleSyncRules(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.syncAuthorized(r); !ok {
		s.m.error("auth")
		http.Error(w, "missing or wrong sync credential", http.StatusUnauthorized)
		return
	}
	set, err := s.watcher.Current(r.Context())
	if err != nil {
		s.m.error("redis")
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	etag := `"v` + strconv.FormatUint(set.Version, 10) + `"`
	w.Header().Set(RulesVersionHeader, strconv.FormatUint(set.Version, 10))
	w.Header().Set("ETag", etag)
	if r.Header.Get("If-None-Match") == etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(set.Body)
}

func (s *Service) handleReady(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.BatchTimeout)
	defer cancel()
	if err := s.be.Ping(ctx); err != nil {
		http.Error(w, "redis: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	if !s.rulesReady() {
		http.Error(w, "rules: "+errNoRules.Error(), http.StatusServiceUnavailable)
		return
	}
	_, _ = io.WriteString(w, "ok\n")
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func (s *Service) redisError(w http.ResponseWriter, err error) {
	s.m.error("redis")
	s.log.Warn("admin request failed", "err", err)
	writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
}

// KeyHash names a caller key in logs: callers' keys are personal data (and often
// credentials), and an operator who needs to find a caller's lines hashes the key the
// same way (package keyhash, which the filter's access-log metadata uses too).
func KeyHash(key string) string { return keyhash.String(key) }

// audit logs an admin change: who, from where, what.
func (s *Service) audit(r *http.Request, action string, attrs ...any) {
	args := append([]any{"action", action, "by", actor(r), "remote", r.RemoteAddr, "at", time.Now().UTC().Format(time.RFC3339Nano)}, attrs...)
	s.log.Info("audit", args...)
}

func actor(r *http.Request) string {
	if a := r.Header.Get(ActorHeader); a != "" {
		if len(a) > 128 {
			a = a[:128]
		}
		return a
	}
	return "admin"
}

package plugin

import (
	"encoding/binary"
	"errors"
	"strconv"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/header"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/rule"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Action is what a stream callback tells the proxy.
type Action uint32

const (
	Continue Action = 0
	Pause    Action = 1
)

// maxCASAttempts bounds every compare-and-swap loop on shared data. When a request's
// buckets cannot be written within it, the request is decided by its rules' fail mode
// (counted in tollgate.cas_retry_exhausted).
const maxCASAttempts = 8

// rulesKey holds the newest rule set fetched from the service, so every worker — and a
// worker VM started later — enforces it: uvarint version, then the JSON.
const rulesKey = "tg:rules"

// nodeKey is the node id the first worker of an Envoy drew when neither sync.node nor
// Envoy's node names the gateway (nodeID).
const nodeKey = "tg:node"

// config is the parsed rule set plus what the plugin derives from it.
type config struct {
	*rule.Config
	// costFrom is set when a rule takes its cost from the response: only then does a
	// request's answer look for charges to keep until the response ends.
	costFrom bool
	// inFlight: some rule has max_in_flight (requests take slots).
	inFlight bool
}

func (c *config) syncEnabled() bool { return c.Config != nil && c.Sync.Cluster != "" }

// Plugin is the root context of one worker VM.
type Plugin struct {
	host Host
	cfg  config
	// base is the plugin configuration's own rule set; rules fetched from the service
	// replace its rules, lists and tiers but never its sync settings.
	base         *rule.Config
	rulesVersion uint64
	table        table
	inflight     inflight
	sync         *syncer
	m            *metrics
	rnd          uint64
	calls        map[uint32]call
	// streams holds the paused streams, for the answers to their callouts.
	streams   map[uint32]*Stream
	fetching  bool
	worker    uint32
	strictSeq uint64
	peerFn    func() string // p.peerAddr, bound once so requests do not allocate it
	// propertyFn is p.property, bound once like peerFn.
	propertyFn func([]string) (string, bool)
	// texts is the installed rule set's fixed header text.
	texts texts
	// free holds finished streams for the next requests to reuse (with their buffers).
	free []*Stream
	// delayed holds the streams shaping holds until their release time.
	delayed []*Stream
	// waiters holds the paused streams that wait for an acquire another request of this
	// gateway (on any worker) asked (acquire.go).
	waiters []*Stream
	// tickMs is the tick period last asked of the host (setTick).
	tickMs uint32
	// listsHaveCIDR is set when an allow/deny entry is an address range.
	listsHaveCIDR bool
	// node is the gateway id sent with every batch (RATIONALE.md §6): the configured
	// one, else Envoy's node.id, else the pod name Istio puts in the node metadata.
	node string
	// bearer is "Bearer <secret>" (none when no secret is configured).
	bearer string

	// rstats are the installed rules' stats, parallel to cfg.Rules (nil: rule_stats off).
	rstats []*ruleStats

	// per-request scratch (a VM is single threaded)
	applied []rule.Applied
	ops     []bucketOp
	viewBuf []header.Window
	idBuf   []byte
	body    []byte // a local reply's body
	propBuf []byte // property values read for the current request's keys
	scratch lease.Record
	// chargeSlot is the bucket a response's cost is charged to (its own slot buffer:
	// charges run outside any request's decision).
	chargeSlot slot
	chargeBuf  algo.State
	hdrBuf     [][2]string
	callBuf    []byte
	meta       []byte // a decision's filter-state value
	// keyNames caches the hashed names of recent caller keys for the metadata.
	keyNames keyNames
}

type callKind uint8

const (
	callSync   callKind = iota
	callRules           // a rule-set fetch
	callStrict          // a paused request's strict checks and acquires
	callProbe           // is the service alive while a sync waits (syncer.probe)
)

type call struct {
	kind   callKind
	stream uint32
}

// New returns the plugin for one worker VM.
func New(h Host) *Plugin {
	now := h.NowUs()
	seed := h.Seed()
	p := &Plugin{
		host:    h,
		calls:   map[uint32]call{},
		streams: map[uint32]*Stream{},
		rnd:     seed | 1,
		worker:  uint32(seed>>32) | 1,
	}
	p.table = table{host: h, slots: defaultSlots, probes: defaultProbes}
	// The VM's holder id comes from the seed, not from p.rnd: drawing it there would shift
	// every later jitter, and simulations replay a seed's decisions.
	p.inflight = inflight{host: h, self: (seed*0x9e3779b97f4a7c15)>>1 | 1, fence: p.table.fenceCas}
	p.sync = newSyncer(p, p.worker)
	p.strictSeq = uint64(now)
	p.peerFn = p.peerAddr
	p.propertyFn = p.property
	return p
}

// OnVMStart accepts any VM configuration (Tollgate reads only the plugin configuration).
func (p *Plugin) OnVMStart([]byte) bool { return true }

// OnPluginStart parses the plugin configuration. A bad configuration is refused with a
// critical log line naming the field; on a reconfiguration the previous rules keep serving.
func (p *Plugin) OnPluginStart(data []byte) bool {
	cfg, err := rule.Parse(data)
	if err != nil {
		p.host.Log(LogCritical, "tollgate: invalid plugin configuration: "+err.Error())
		return false
	}
	if p.m == nil {
		p.m = newMetrics(p.host)
		p.table.m = p.m
	}
	p.base = cfg
	p.install(cfg, cfg.Version)
	s := &cfg.Sync
	if s.Authority == "" {
		s.Authority = s.Cluster
	}
	p.node = p.nodeID(s.Node)
	p.bearer = ""
	if s.Secret != "" {
		p.bearer = "Bearer " + s.Secret
	}
	p.table.idleUs = s.IdleTTLMs * 1000
	if s.TableSlots > 0 && uint64(s.TableSlots) != p.table.slots {
		p.table.slots = uint64(s.TableSlots)
	}
	p.m.set(p.m.slots, p.table.slots)
	// A rule set fetched from the service by another worker (or before a restart of this
	// VM) is newer than the plugin configuration: enforce it.
	p.loadSharedRules()
	// With sync, ticks come four times per sync interval: the sync runs on every fourth,
	// and the others only look at the shared health, so that a request paused for the
	// service when it stops answering is answered within a quarter interval of the moment
	// the gateway counts it down (RATIONALE.md §3), not at its callout timeout. Without
	// sync the tick hands the counters to the host (MetricsFlushMs), and beats for the
	// slots in flight (inflight).
	p.setTick(p.baseTickMs())
	p.host.Log(LogInfo, "tollgate: started with "+strconv.Itoa(len(p.cfg.Rules))+" rules, version "+strconv.FormatUint(p.rulesVersion, 10))
	return true
}

// install swaps the active rule set. Streams already decided keep what they decided with;
// the next request sees the new set (the swap is one pointer assignment in a
// single-threaded VM, so no request sees half of each).
func (p *Plugin) install(cfg *rule.Config, version uint64) {
	p.cfg = config{Config: cfg}
	for i := range cfg.Rules {
		p.cfg.costFrom = p.cfg.costFrom || cfg.Rules[i].CostFrom != nil
		p.cfg.inFlight = p.cfg.inFlight || cfg.Rules[i].MaxInFlight > 0
	}
	p.rulesVersion = version
	p.listsHaveCIDR = false
	for _, l := range [][]rule.Pattern{cfg.Allow, cfg.Deny} {
		for i := range l {
			p.listsHaveCIDR = p.listsHaveCIDR || l[i].CIDR != nil
		}
	}
	p.texts = newTexts(cfg)
	p.rstats = nil
	if p.m != nil {
		p.m.set(p.m.rulesVersion, version)
		if cfg.Telemetry.RuleStats {
			p.rstats = p.m.forRules(cfg)
		}
	}
}

// nodeID is the gateway's id: the configured sync.node, else what Envoy knows of
// itself — node.id, or under Istio the pod name in the node metadata — else a random id
// that the first worker writes to nodeKey and every other worker reads. Every worker of
// one Envoy resolves the same one: the id names the gateway's batch sequence, its
// idempotency records and the service's record of the leases it holds (RATIONALE.md §3,
// "What one gateway can do"), and the sync and the acquires of one Envoy's workers
// renew one lease. With a random id per worker the service saw a lease an acquiring
// worker was granted renewed by the syncing worker, which it was not granted to: it
// renewed none of it, and the bucket kept it reserved until its epochs ended (e2e
// TestFleetOneKey: 380 of a bucket of 1,000 reserved by nobody, 954 admitted of 1,333).
func (p *Plugin) nodeID(configured string) string {
	if configured != "" {
		return configured
	}
	for _, path := range [...][]string{{"node", "id"}, {"node", "metadata", "NAME"}} {
		if v, err := p.host.Property(path...); err == nil && len(v) > 0 && len(v) <= wire.MaxStringLen {
			return string(v)
		}
	}
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		v, cas, found, err := p.host.SharedGet(nodeKey)
		if err != nil {
			break
		}
		if found && len(v) > 0 && len(v) <= wire.MaxStringLen {
			return string(v)
		}
		if !found {
			// Created once: a worker that writes after another one did meets that
			// one's CAS (table.fenceCas) and reads its id.
			cas = p.table.fenceCas()
		}
		id := "gw-" + strconv.FormatUint(p.nextRand()>>16, 36)
		written, err := p.host.SharedSet(nodeKey, []byte(id), cas)
		if err != nil {
			return id
		}
		if written {
			return id
		}
	}
	return "gw-" + strconv.FormatUint(p.nextRand()>>16, 36) // shared data unusable: its own
}

// OnTick syncs (the leader) or queues this worker's urgent buckets, picks up rules
// other workers fetched, and hands the counts of the tick's period to the host.
func (p *Plugin) OnTick() {
	p.onTick()
	p.FlushMetrics()
}

// FlushMetrics hands the counts kept in the VM to the host (metrics.flush). The tick
// calls it; a host that reads the metrics outside Envoy's admin (the project's wazero host,
// filter/nativehost) calls it before reading, as a scrape of Envoy sees what the last tick
// flushed.
func (p *Plugin) FlushMetrics() {
	if p.m != nil {
		p.m.flush()
	}
}

func (p *Plugin) onTick() {
	now := p.host.NowUs()
	if len(p.delayed) > 0 {
		p.releaseDue(now)
	}
	if len(p.waiters) > 0 {
		p.wakeWaiters(now)
	}
	p.settleTick()
	p.inflightTick(now)
	if !p.cfg.syncEnabled() {
		p.loadSharedRules()
		return
	}
	// The host ticks four times per interval (OnConfigure): the interval's work runs on
	// every fourth tick, the others only settle paused requests once the service is down.
	if now-p.sync.lastTickUs >= p.sync.intervalUs()*7/8 {
		p.sync.lastTickUs = now
		p.loadSharedRules()
		p.sync.tick(now)
	}
	// On every tick: a loaded host's ticks come late, each of them then an interval's.
	p.sync.probe(now)
	if len(p.streams) > 0 && !p.sync.healthy(now) {
		for _, s := range p.streams { // paused requests only
			s.settle(now)
		}
	}
	if len(p.streams) > 0 {
		p.settleLost(now)
	}
}

// settleLost answers, without the service, every paused request whose callout has had
// no answer for lostCalloutUs. The host answers each callout by its timeout (a failed
// call included), so this is for an answer the host never delivers: the request must
// not hang on it (checks_lost counts them; the answer is degraded, as for a failed
// check).
func (p *Plugin) settleLost(now int64) {
	lostUs := p.lostCalloutUs()
	settled := false
	for _, s := range p.streams {
		if st := s.paused; st != nil && !st.settled && st.askedUs > 0 && now-st.askedUs > lostUs {
			p.m.inc(p.m.checksLost)
			p.forgetCalls(s.id)
			s.settle(now)
			settled = true
		}
	}
	if settled {
		_ = p.host.SetEffectiveContext(p.host.RootID())
	}
}

// forgetCalls drops the callouts stream id is owed: their answers will not come, or
// will find it settled.
func (p *Plugin) forgetCalls(id uint32) {
	for token, c := range p.calls {
		if c.kind == callStrict && c.stream == id {
			delete(p.calls, token)
		}
	}
}

// lostCalloutUs is how long past a callout's start its answer counts as lost: its
// timeout, and as long again (or a sync interval, if longer) for a loaded host's late
// timer.
func (p *Plugin) lostCalloutUs() int64 {
	return (2*p.cfg.Sync.TimeoutMs + max(p.cfg.Sync.IntervalMs, 0)) * 1000
}

// OnHTTPCallResponse routes a callout's answer. headers is empty when the call failed or
// timed out (Envoy delivers no headers then).
func (p *Plugin) OnHTTPCallResponse(token uint32, headers [][2]string, body []byte) {
	c, ok := p.calls[token]
	if !ok {
		return
	}
	delete(p.calls, token)
	now := p.host.NowUs()
	switch c.kind {
	case callSync:
		if p.sync.answers(token) {
			p.sync.onResponse(now, token, headers, body)
		}
	case callRules:
		p.fetching = false
		p.onRules(headers, body)
	case callStrict:
		if s, ok := p.streams[c.stream]; ok {
			s.onCheckResponse(now, headers, body)
		}
	case callProbe:
		p.sync.onProbe(now, token, headers)
	}
	if len(p.waiters) > 0 && c.kind != callRules {
		// An acquire's or a sync's answer may have brought the lease they wait for.
		p.wakeWaiters(now)
	}
}

// maxFreeStreams bounds the finished streams kept for reuse (about the requests one
// worker has in flight at once; beyond it, finished streams are left to the GC).
const maxFreeStreams = 1024

// NewStream creates the context of one HTTP request, reusing a finished one.
func (p *Plugin) NewStream(id uint32) *Stream {
	var s *Stream
	if n := len(p.free); n > 0 {
		s, p.free = p.free[n-1], p.free[:n-1]
	} else {
		s = &Stream{p: p}
		s.headerFn = s.header
	}
	s.id = id
	return s
}

// rulesBehind is called when a sync reply shows a newer rule set at the service.
func (p *Plugin) rulesBehind(version uint64) {
	if p.loadSharedRules() && p.rulesVersion >= version {
		return
	}
	if p.fetching {
		return
	}
	hdr := [][2]string{
		{":method", "GET"},
		{":path", "/v1/sync/rules"},
		{":authority", p.cfg.Sync.Authority},
	}
	if p.bearer != "" {
		hdr = append(hdr, [2]string{"authorization", p.bearer})
	}
	token, err := p.host.HTTPCall(p.cfg.Sync.Cluster, hdr, nil, uint32(p.cfg.Sync.TimeoutMs))
	if err != nil {
		p.host.Log(LogWarn, "tollgate: rules fetch: "+err.Error())
		return
	}
	p.fetching = true
	p.calls[token] = call{kind: callRules}
}

// onRules validates a fetched rule set and, if good, installs it for every worker.
func (p *Plugin) onRules(headers [][2]string, body []byte) {
	if headerValue(headers, ":status") != "200" {
		return
	}
	version, err := strconv.ParseUint(headerValue(headers, "x-tollgate-rules-version"), 10, 64)
	if err != nil {
		p.host.Log(LogError, "tollgate: rules fetch: missing x-tollgate-rules-version")
		return
	}
	if version <= p.rulesVersion {
		return
	}
	cfg, err := p.parseFetched(body, version)
	if err != nil {
		p.m.inc(p.m.rulesRejected)
		p.host.Log(LogError, "tollgate: refused rule set version "+strconv.FormatUint(version, 10)+" from the service, keeping version "+strconv.FormatUint(p.rulesVersion, 10)+": "+err.Error())
		return
	}
	val := binary.AppendUvarint(nil, version)
	val = append(val, body...)
	// Last writer wins: every writer writes a version newer than what it read.
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		cur, cas, found, err := p.host.SharedGet(rulesKey)
		if err != nil {
			break
		}
		if found {
			if v, n := binary.Uvarint(cur); n > 0 && v >= version {
				break
			}
		}
		if !found {
			cas = 0
		}
		if ok, err := p.host.SharedSet(rulesKey, val, cas); err != nil || ok {
			break
		}
	}
	p.install(cfg, version)
	p.host.Log(LogInfo, "tollgate: enforcing rule set version "+strconv.FormatUint(version, 10))
}

// parseFetched parses a rule set from the service and keeps the plugin's own sync
// settings (the service does not know the gateway's cluster names or secret).
func (p *Plugin) parseFetched(body []byte, version uint64) (*rule.Config, error) {
	cfg, err := rule.Parse(body)
	if err != nil {
		return nil, err
	}
	if p.base == nil {
		return nil, errors.New("no plugin configuration")
	}
	cfg.Sync = p.base.Sync
	cfg.Telemetry = p.base.Telemetry
	cfg.Version = version
	return cfg, nil
}

// loadSharedRules installs a newer rule set another worker stored; reports whether the
// shared copy was read.
func (p *Plugin) loadSharedRules() bool {
	val, _, found, err := p.host.SharedGet(rulesKey)
	if err != nil || !found {
		return false
	}
	version, n := binary.Uvarint(val)
	if n <= 0 {
		return false
	}
	if version > p.rulesVersion {
		cfg, err := p.parseFetched(val[n:], version)
		if err != nil {
			p.host.Log(LogError, "tollgate: shared rule set version "+strconv.FormatUint(version, 10)+": "+err.Error())
			return false
		}
		p.install(cfg, version)
	}
	return true
}

// nextRand is xorshift64*: the jitter only needs to spread clients out, not be secret.
func (p *Plugin) nextRand() uint64 {
	x := p.rnd
	x ^= x >> 12
	x ^= x << 25
	x ^= x >> 27
	p.rnd = x
	return x * 2685821657736338717
}

// peerAddr is the downstream address (Envoy's source.address property), read only when
// the rules need it.
func (p *Plugin) peerAddr() string {
	v, err := p.host.Property("source", "address")
	if err != nil {
		return ""
	}
	return string(v)
}

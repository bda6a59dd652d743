package plugin

import (
	"strconv"

	"github.com/tollgate-rl/tollgate/shared/rule"
)

// metrics are the filter's Envoy stats. Names follow Envoy's dotted convention with a
// "tollgate." prefix; Envoy's Prometheus endpoint turns them into tollgate_* series.
// Every stat is defined at configuration time. The fields below (and ruleStats) are
// indexes into ids, not the host's ids: counts are kept in the VM (pending) and handed to
// the host on the root tick (flush), one proxy_increment_metric per stat that moved, not
// one per count — a request then makes no metric host call at all (RATIONALE.md §9,
// "Counters are flushed on the tick"). Gauge and histogram values (set, RecordedMetrics)
// go to the host at once: they are set off the request path.
type metrics struct {
	host Host
	// ids are the host's metric ids; pending, the counts not yet handed to the host, both
	// indexed by the fields' values.
	ids     []uint32
	pending []int64
	dirty   bool // some pending count is not zero

	allowed, rejected, shadowRejected, denied, bypassed uint32
	casExhausted, degraded, failClosed, strictChecks    uint32
	acquires, checkFailed, checksLost                   uint32
	// acquiresShared counts requests that waited for an acquire another request of the
	// gateway asked; coldAdmitted, requests admitted on a cold-start allowance.
	acquiresShared, coldAdmitted                         uint32
	syncSent, syncFailed, syncDropped, batchDeltas       uint32
	urgentDropped, deltasRuleGone, deltasRefused         uint32
	breakerState                                         uint32
	rulesVersion, rulesRejected, leaseGranted, evictions uint32
	penalized, slots, slotsUsed, syncRTT                 uint32
	keyMissing                                           uint32 // refused by a missing_key "deny" policy
	// responseCost counts permits charged from responses beyond their estimates;
	// responseCostMissing, responses whose cost could not be read (charged the estimate).
	responseCost, responseCostMissing uint32
	delayed                           uint32 // requests held for their permit (max_delay)
	// requests refused by a rule's max_in_flight; slots that could not be taken or given
	// back (shared data failing, table full); slots of dead VMs dropped
	inflightRejected, inflightFailed, inflightReclaimed uint32

	// rules holds each rule id's per-rule stats, defined once per id (a reconfiguration
	// that keeps a rule keeps its ids: Envoy hands out a new id on every definition).
	rules map[string]*ruleStats
}

// ruleStats are one rule's stat indexes (metrics.ids), indexed by the stat* constants (names in RuleStats).
type ruleStats [nRuleStats]uint32

const (
	statAllowed       = iota // requests the rule admitted
	statLimited              // requests the rule refused (429)
	statShadowLimited        // requests the (shadow) rule would have refused
	statDegraded             // decisions on the rule made without the service
	statStrictChecks         // the strict rule's checks sent to the service
	statStrictFailed         // those that failed (no usable answer)
	nRuleStats
)

// RecordedMetrics are the stats the filter sets at once (gauges and a histogram set off
// the request path, metrics.set) rather than counts flushed on the tick: a reader of
// these need not wait for a tick.
var RecordedMetrics = []string{"tollgate." + statTableSlots, "tollgate." + statRulesVersion, "tollgate." + statSyncRTT}

// The names of the stats set with metrics.set (RecordedMetrics).
const (
	statTableSlots   = "bucket_table_slots"
	statRulesVersion = "rules_version"
	statSyncRTT      = "sync_rtt_ms"
)

// maxPerRuleMetrics bounds the rules with stats of their own (6 series each), whatever
// the rule sets a long-running gateway sees.
const maxPerRuleMetrics = 200

// Per-rule stats. Their names carry the rule in Istio's tag encoding, "rule=.=<id>;.;"
// before "tollgate.rule.<stat>": Istio's extraStatTags ["rule"] generates exactly the
// stats_tags regex that strips it into a "rule" tag, and envoy.yaml configures the same
// one, so Prometheus sees one series per rule of one metric,
// tollgate_rule_allowed{rule="api"}, not one metric name per rule. Rule ids
// ([A-Za-z0-9_.-]) never contain the ";.;" that ends the tag.
const (
	RuleTagPrefix = "rule=.="
	RuleTagEnd    = ";.;"
	// RuleStatsTagRegex is the stats_tags regex (Envoy's convention: the first group is
	// cut from the name, the second is the tag's value).
	RuleStatsTagRegex = `(rule=\.=(.+?);\.;)`
)

// RuleStats names the per-rule stats (all counters), indexed by the stat* constants.
var RuleStats = [nRuleStats]string{"allowed", "limited", "shadow_limited", "degraded", "strict_checks", "strict_check_failures"}

// RuleStatName is the stat name of one of rule id's stats (stat from RuleStats).
func RuleStatName(id, stat string) string {
	return RuleTagPrefix + id + RuleTagEnd + "tollgate.rule." + stat
}

func newMetrics(h Host) *metrics {
	m := &metrics{host: h, rules: map[string]*ruleStats{}}
	def := func(kind MetricKind, name string) uint32 { return m.define(kind, "tollgate."+name) }
	m.allowed = def(Counter, "requests_allowed")
	m.rejected = def(Counter, "requests_rejected")
	m.shadowRejected = def(Counter, "requests_shadow_rejected")
	m.denied = def(Counter, "requests_denied_by_list")
	m.bypassed = def(Counter, "requests_bypassed")
	m.casExhausted = def(Counter, "cas_retry_exhausted")
	m.degraded = def(Counter, "answers_degraded")
	m.failClosed = def(Counter, "answers_fail_closed")
	m.strictChecks = def(Counter, "strict_checks")
	m.penalized = def(Counter, "requests_penalized")
	m.syncSent = def(Counter, "sync_sent")
	m.syncFailed = def(Counter, "sync_failed")
	m.syncDropped = def(Counter, "sync_batches_dropped")
	m.batchDeltas = def(Counter, "sync_deltas_sent")
	m.acquires = def(Counter, "acquires")
	m.acquiresShared = def(Counter, "acquires_shared")
	m.coldAdmitted = def(Counter, "requests_cold_admitted")
	m.checkFailed = def(Counter, "checks_failed")
	m.checksLost = def(Counter, "checks_lost")
	m.urgentDropped = def(Counter, "urgent_dropped")
	m.deltasRuleGone = def(Counter, "deltas_rule_gone")
	m.deltasRefused = def(Counter, "deltas_refused")
	// breaker_state counts the worker VMs whose breaker is not closed (each worker adds
	// and removes itself): a gauge every worker set would show only the last writer.
	m.breakerState = def(Gauge, "breaker_state")
	m.rulesVersion = def(Gauge, statRulesVersion)
	m.rulesRejected = def(Counter, "rules_rejected")
	m.leaseGranted = def(Counter, "lease_granted")
	m.evictions = def(Counter, "bucket_evictions")
	// The bucket table's occupancy: slots (its size) and slots used (each worker adds
	// the slots it creates; a slot is never deleted, only taken over).
	m.slots = def(Gauge, statTableSlots)
	m.slotsUsed = def(Gauge, "bucket_table_slots_used")
	// Sync round trip in milliseconds, from a batch's send to its answer (Envoy's
	// default histogram buckets, 0.5 ms to 1 h, suit milliseconds).
	m.syncRTT = def(Histogram, statSyncRTT)
	m.keyMissing = def(Counter, "requests_key_missing")
	m.responseCost = def(Counter, "response_cost_charged")
	m.responseCostMissing = def(Counter, "response_cost_missing")
	m.delayed = def(Counter, "requests_delayed")
	m.inflightRejected = def(Counter, "requests_concurrency_limited")
	m.inflightFailed = def(Counter, "concurrency_failures")
	m.inflightReclaimed = def(Counter, "concurrency_slots_reclaimed")
	return m
}

// define defines a stat with the host and returns its index. A stat the host refused
// keeps an index (its counts are dropped at the flush, as the host would have refused
// each increment).
func (m *metrics) define(kind MetricKind, name string) uint32 {
	id, err := m.host.DefineMetric(kind, name)
	if err != nil {
		m.host.Log(LogWarn, "tollgate: define metric "+strconv.Quote(name)+": "+err.Error())
	}
	m.ids = append(m.ids, id)
	m.pending = append(m.pending, 0)
	return uint32(len(m.ids) - 1)
}

func (m *metrics) inc(i uint32) {
	m.pending[i]++
	m.dirty = true
}

func (m *metrics) add(i uint32, n int64) {
	m.pending[i] += n
	m.dirty = true
}

// set sets a gauge or records a histogram value at once: only the stats of
// RecordedMetrics (readers of the others wait for a tick).
func (m *metrics) set(i uint32, v uint64) { m.host.RecordMetric(m.ids[i], v) }

// flush hands the pending counts to the host: one increment per stat that moved since
// the last flush. The plugin calls it at the end of every root tick.
func (m *metrics) flush() {
	if !m.dirty {
		return
	}
	m.dirty = false
	for i, n := range m.pending {
		if n != 0 {
			m.pending[i] = 0
			m.host.IncrementMetric(m.ids[i], n)
		}
	}
}

// forRules returns the per-rule stats of cfg's rules, parallel to cfg.Rules, defining
// those of rules not seen before; nil entries beyond maxPerRuleMetrics rule ids.
func (m *metrics) forRules(cfg *rule.Config) []*ruleStats {
	out := make([]*ruleStats, len(cfg.Rules))
	for i := range cfg.Rules {
		id := cfg.Rules[i].ID
		rs, ok := m.rules[id]
		if !ok {
			if len(m.rules) >= maxPerRuleMetrics {
				continue
			}
			rs = &ruleStats{}
			for k, stat := range RuleStats {
				rs[k] = m.define(Counter, RuleStatName(id, stat))
			}
			m.rules[id] = rs
		}
		out[i] = rs
	}
	return out
}

// ruleStats returns the stats of an applied rule, or nil when per-rule stats are off or
// the rule is not of the installed set (a request paused across a rule-set swap).
func (p *Plugin) ruleStats(a *rule.Applied) *ruleStats {
	if a.Index < 0 || a.Index >= len(p.rstats) || a.Rule != &p.cfg.Rules[a.Index] {
		return nil
	}
	return p.rstats[a.Index]
}

// countRule counts one of an applied rule's stats.
func (p *Plugin) countRule(a *rule.Applied, stat int) {
	if rs := p.ruleStats(a); rs != nil {
		p.m.inc(rs[stat])
	}
}

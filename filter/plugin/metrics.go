package plugin

import "strconv"

// metrics are the filter's Envoy stats. Names follow Envoy's dotted convention with a
// "tollgate." prefix; Envoy's Prometheus endpoint turns them into tollgate_* series.
type metrics struct {
	host Host

	allowed, rejected, shadowRejected, denied, bypassed  uint32
	casExhausted, degraded, failClosed, strictChecks     uint32
	acquires, checkFailed                                uint32
	syncSent, syncFailed, syncDropped, batchDeltas       uint32
	urgentDropped, deltasRuleGone, deltasRefused         uint32
	breakerState                                         uint32
	rulesVersion, rulesRejected, leaseGranted, evictions uint32
	penalized                                            uint32
	keyMissing                                           uint32 // refused by a missing_key "deny" policy

	// per-rule rejection counters, defined lazily and capped to keep cardinality bounded.
	perRule map[string]uint32
}

const maxPerRuleMetrics = 200

func newMetrics(h Host) *metrics {
	m := &metrics{host: h, perRule: map[string]uint32{}}
	def := func(kind MetricKind, name string) uint32 {
		id, err := h.DefineMetric(kind, "tollgate."+name)
		if err != nil {
			h.Log(LogWarn, "tollgate: define metric "+strconv.Quote(name)+": "+err.Error())
		}
		return id
	}
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
	m.checkFailed = def(Counter, "checks_failed")
	m.urgentDropped = def(Counter, "urgent_dropped")
	m.deltasRuleGone = def(Counter, "deltas_rule_gone")
	m.deltasRefused = def(Counter, "deltas_refused")
	// breaker_state counts the worker VMs whose breaker is not closed (each worker adds
	// and removes itself): a gauge every worker set would show only the last writer.
	m.breakerState = def(Gauge, "breaker_state")
	m.rulesVersion = def(Gauge, "rules_version")
	m.rulesRejected = def(Counter, "rules_rejected")
	m.leaseGranted = def(Counter, "lease_granted")
	m.evictions = def(Counter, "bucket_evictions")
	m.keyMissing = def(Counter, "requests_key_missing")
	return m
}

func (m *metrics) inc(id uint32)           { m.host.IncrementMetric(id, 1) }
func (m *metrics) add(id uint32, n int64)  { m.host.IncrementMetric(id, n) }
func (m *metrics) set(id uint32, v uint64) { m.host.RecordMetric(id, v) }

// ruleRejected counts a rejection by rule id (bounded number of series).
func (m *metrics) ruleRejected(rule string) {
	id, ok := m.perRule[rule]
	if !ok {
		if len(m.perRule) >= maxPerRuleMetrics {
			return
		}
		var err error
		id, err = m.host.DefineMetric(Counter, "tollgate.rule."+rule+".rejected")
		if err != nil {
			return
		}
		m.perRule[rule] = id
	}
	m.inc(id)
}

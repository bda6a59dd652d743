package service

import (
	"errors"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Metrics are the service's Prometheus metrics, on their own registry so several
// instances can live in one process (tests).
type Metrics struct {
	Registry *prometheus.Registry

	batches         *prometheus.CounterVec   // endpoint, outcome
	deltas          *prometheus.CounterVec   // endpoint
	keys            *prometheus.CounterVec   // endpoint
	batchSeconds    *prometheus.HistogramVec // endpoint
	redisSeconds    *prometheus.HistogramVec // op
	redisErrors     *prometheus.CounterVec   // op
	reloads         prometheus.Counter
	grants          prometheus.Counter
	granted         prometheus.Counter
	overshoot       prometheus.Counter
	replays         prometheus.Counter
	reclaimed       prometheus.Counter
	rejections      *prometheus.CounterVec // rule
	refused         *prometheus.CounterVec // endpoint
	paramsCorrected prometheus.Counter
	clamped         prometheus.Counter
	excess          prometheus.Counter
	strictDenied    *prometheus.CounterVec // rule
	early           prometheus.Counter
	rejectedClamped prometheus.Counter
	readsDropped    *prometheus.CounterVec
	penalized       prometheus.Counter
	errors          *prometheus.CounterVec // kind
	rulesVersion    prometheus.Gauge
	fleet           prometheus.Gauge
	insecure        prometheus.Gauge
	fleetJoins      *prometheus.CounterVec // outcome
	secretReloads   *prometheus.CounterVec // secret, outcome
	ruleAdmitted    *prometheus.CounterVec // rule
	ruleRefused     *prometheus.CounterVec // rule
	ruleOver        *prometheus.CounterVec // rule
	fleetx          *fleetMetrics

	ruleMu    sync.Mutex
	ruleNames map[string]struct{}
}

// maxRuleLabels bounds the distinct rule label values (rule ids come from gateways).
const maxRuleLabels = 1000

// NewMetrics registers the metrics on a new registry.
func NewMetrics() *Metrics {
	r := prometheus.NewRegistry()
	f := func(c prometheus.Collector) { r.MustRegister(c) }
	m := &Metrics{Registry: r, ruleNames: map[string]struct{}{}}
	m.batches = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_sync_batches_total", Help: "Sync and check batches by endpoint and outcome (ok, invalid, unauthorized, too_large, unavailable)."}, []string{"endpoint", "outcome"})
	m.deltas = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_sync_deltas_total", Help: "Bucket deltas received."}, []string{"endpoint"})
	m.keys = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_sync_keys_total", Help: "Distinct caller keys per batch, summed."}, []string{"endpoint"})
	m.batchSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tollgate_sync_batch_seconds", Help: "Time to apply one batch.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"endpoint"})
	m.redisSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tollgate_redis_seconds", Help: "Redis round trips (one pipeline) by operation.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}, []string{"op"})
	m.redisErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_redis_errors_total", Help: "Failed Redis round trips by operation."}, []string{"op"})
	m.reloads = prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_script_reloads_total", Help: "Script loads after NOSCRIPT (failover or restart)."})
	m.grants = prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_lease_grants_total", Help: "Deltas answered with a new lease."})
	m.granted = prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_lease_granted_permits_total", Help: "Permits reserved by new leases."})
	m.overshoot = prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_overshoot_permits_total", Help: "Estimated over-admission: permits charged (Over and uncovered Leased) beyond what the bucket held."})
	m.replays = prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_replayed_deltas_total", Help: "Deltas of retried batches answered without being applied again."})
	m.reclaimed = prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_lease_reclaimed_permits_total", Help: "Lease permits reclaimed from gateways that stopped syncing."})
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_sync_deltas_refused_total", Help: "Deltas refused (not applied) while the rest of their batch was: invalid parameters, a bucket twice in one batch."}, []string{"endpoint"})
	m.paramsCorrected = prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_sync_params_corrected_total", Help: "Deltas whose limits differed from the service's rule set (a gateway on another rules version, or a forged report): charged under the service's."})
	m.clamped = prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_debt_clamped_permits_total", Help: "Reported consumption beyond one capacity of debt, not charged."})
	m.excess = prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_report_excess_permits_total", Help: "Reported consumption beyond what the rule could admit over the reported period, not charged."})
	m.rejections = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_rejections_total", Help: "Requests rejected by gateways (reported in deltas) by rule."}, []string{"rule"})
	m.strictDenied = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_strict_denied_total", Help: "Strict checks refused by rule."}, []string{"rule"})
	m.rejectedClamped = prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_rejected_clamped_total", Help: "Refusal counts reported beyond what a gateway can refuse in the period a delta reports (100 a millisecond per bucket, 2^22 a batch), not counted."})
	m.readsDropped = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_sync_reads_dropped_total", Help: "Deltas that reported nothing (no consumption, refusal, lease or acquire), answered without the bucket's numbers: refused on /v1/sync, admitted at cost 0 on /v1/check."}, []string{"endpoint"})
	m.early = prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_early_requests_total", Help: "Rejected requests that came back before their Retry-After (penalty signal)."})
	m.penalized = prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_penalized_answers_total", Help: "Bucket states answered while the caller key was in a penalty cooldown."})
	m.errors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_errors_total", Help: "Errors by kind (decode, auth, too_large, invalid, redis, policy, timeout, rules_invalid, internal, alive)."}, []string{"kind"})
	m.rulesVersion = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_rules_version", Help: "Current rule-set version known to this instance."})
	m.fleet = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_fleet_nodes", Help: "Gateways seen syncing recently."})
	m.insecure = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tollgate_insecure", Help: "1 when the service runs with --insecure: without a sync secret, /v1/sync, /v1/check and /v1/sync/rules accept any caller."})
	m.secretReloads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_secret_reloads_total", Help: "Secret file reads on SIGHUP by secret (sync, admin, redis) and outcome (ok, error: the previous value stays in use)."}, []string{"secret", "outcome"})
	m.fleetJoins = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_fleet_joins_total", Help: "Gateways past their probation offered to the fleet set: joined, or deferred (join rate or --fleet-max-nodes reached; offered again at the next refresh)."}, []string{"outcome"})
	m.ruleAdmitted = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_rule_admitted_permits_total", Help: "Permits admitted by rule, as gateways reported them (out of a lease or outside one) and strict checks taken."}, []string{"rule"})
	m.ruleRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_rule_refused_requests_total", Help: "Requests refused by rule: gateways' 429s and strict checks denied."}, []string{"rule"})
	m.ruleOver = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_rule_overadmitted_permits_total", Help: "Permits admitted beyond what the bucket held, by rule (over-admission within the lease bound)."}, []string{"rule"})
	m.fleetx = newFleetMetrics(f)
	for _, c := range []prometheus.Collector{m.ruleAdmitted, m.ruleRefused, m.ruleOver, m.batches, m.deltas, m.keys, m.batchSeconds, m.redisSeconds, m.redisErrors,
		m.reloads, m.grants, m.granted, m.overshoot, m.replays, m.reclaimed, m.refused, m.paramsCorrected, m.clamped, m.excess, m.rejections, m.strictDenied, m.early, m.rejectedClamped, m.readsDropped,
		m.penalized, m.errors, m.rulesVersion, m.fleet, m.insecure, m.secretReloads, m.fleetJoins,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		f(c)
	}
	return m
}

// SecretReload counts one read of a secret file on reload: ok, or not (the previous
// value stays in use).
func (m *Metrics) SecretReload(secret string, ok bool) {
	outcome := "ok"
	if !ok {
		outcome = "error"
	}
	m.secretReloads.WithLabelValues(secret, outcome).Inc()
}

// FleetJoins implements store.FleetMetrics.
func (m *Metrics) FleetJoins(joined, deferred int) {
	m.fleetJoins.WithLabelValues("joined").Add(float64(joined))
	m.fleetJoins.WithLabelValues("deferred").Add(float64(deferred))
}

// RoundTrip implements store.Metrics.
func (m *Metrics) RoundTrip(op string, d time.Duration, err error) {
	m.redisSeconds.WithLabelValues(op).Observe(d.Seconds())
	if err != nil && !isNil(err) {
		m.redisErrors.WithLabelValues(op).Inc()
	}
}

// ScriptReload implements store.Metrics.
func (m *Metrics) ScriptReload() { m.reloads.Inc() }

func isNil(err error) bool { return errors.Is(err, redis.Nil) }

func (m *Metrics) error(kind string) { m.errors.WithLabelValues(kind).Inc() }

// rule bounds the label values: ids beyond maxRuleLabels, long ids and ids that are
// not UTF-8 (Prometheus panics on those; rule ids come from gateways) count as "other".
func (m *Metrics) rule(id string) string {
	if len(id) > 64 || !utf8.ValidString(id) {
		return "other"
	}
	m.ruleMu.Lock()
	defer m.ruleMu.Unlock()
	if _, ok := m.ruleNames[id]; ok {
		return id
	}
	if len(m.ruleNames) >= maxRuleLabels {
		return "other"
	}
	m.ruleNames[id] = struct{}{}
	return id
}

// batch records an applied batch.
func (m *Metrics) batch(endpoint string, b *wire.Batch, results []lease.SyncResult, states []wire.State) {
	m.deltas.WithLabelValues(endpoint).Add(float64(len(b.Deltas)))
	keys := make(map[string]struct{}, len(b.Deltas))
	for i := range b.Deltas {
		d := &b.Deltas[i]
		keys[d.Key] = struct{}{}
		r := &results[i]
		if states[i].Flags&wire.StateRefused != 0 {
			m.refused.WithLabelValues(endpoint).Inc()
			continue
		}
		if r.Replay {
			m.replays.Inc()
			continue
		}
		if c, ok := deltaCounts(d, r, &states[i]); ok {
			rule := m.rule(d.Rule)
			if c.admitted > 0 {
				m.ruleAdmitted.WithLabelValues(rule).Add(float64(c.admitted))
			}
			if c.refused > 0 {
				m.ruleRefused.WithLabelValues(rule).Add(float64(c.refused))
			}
			if c.over > 0 {
				m.ruleOver.WithLabelValues(rule).Add(float64(c.over))
			}
		}
		if d.Rejected > 0 {
			m.rejections.WithLabelValues(m.rule(d.Rule)).Add(float64(d.Rejected))
		}
		if d.Early > 0 {
			m.early.Add(float64(d.Early))
		}
		if d.Flags&(wire.FlagStrict|wire.FlagAcquire) != 0 && !r.Allowed {
			m.strictDenied.WithLabelValues(m.rule(d.Rule)).Inc()
		}
		if r.Grant > 0 {
			m.grants.Inc()
			m.granted.Add(float64(r.Grant))
		}
		if r.Overshoot > 0 {
			m.overshoot.Add(float64(r.Overshoot))
		}
		if r.Clamped > 0 {
			m.clamped.Add(float64(r.Clamped))
		}
		if r.Excess > 0 {
			m.excess.Add(float64(r.Excess))
		}
		if r.Reclaimed > 0 {
			m.reclaimed.Add(float64(r.Reclaimed))
		}
		if states[i].PenaltyInMs > 0 {
			m.penalized.Inc()
		}
	}
	m.keys.WithLabelValues(endpoint).Add(float64(len(keys)))
}

package rls

import "github.com/prometheus/client_golang/prometheus"

// metrics of the rate limit service, on the sync service's registry (its checks also
// count in the service's batch metrics, endpoint "rls").
type metrics struct {
	requests    *prometheus.CounterVec // code
	descriptors *prometheus.CounterVec // outcome
	seconds     prometheus.Histogram
	clamped     prometheus.Counter

	// Leases (a replica deciding from leases).
	acquires, acquiresShared, leaseGranted prometheus.Counter
	syncs                                  *prometheus.CounterVec // outcome
	tableFull                              prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_rls_requests_total",
			Help: "ShouldRateLimit calls by answer (ok, over_limit, either with _degraded while Redis was unreachable; too_many_descriptors; invalid, unauthenticated, internal)."}, []string{"code"}),
		descriptors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_rls_descriptors_total",
			Help: "Descriptors by outcome (ok, over_limit, shadow_over_limit, degraded, fail_closed, unmatched: no rule's descriptor match fits; too_many: in a request of more than 64)."}, []string{"outcome"}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tollgate_rls_request_seconds",
			Help: "Time to answer one ShouldRateLimit call.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
	}
	m.clamped = prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_rls_hits_clamped_total",
		Help: "Descriptors whose hits_addend exceeded the largest cost a request may take (1,000,000) and was clamped to it."})
	m.acquires = prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_rls_acquires_total",
		Help: "Acquires this replica sent: calls whose bucket had no usable lease asked Redis (one per bucket at a time)."})
	m.acquiresShared = prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_rls_acquires_shared_total",
		Help: "Calls that waited for another call's acquire of the same bucket instead of asking Redis."})
	m.leaseGranted = prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_rls_lease_granted_total",
		Help: "Permits granted to this replica as leases."})
	m.syncs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tollgate_rls_syncs_total",
		Help: "This replica's sync batches by outcome (ok, failed: resent unchanged at the next interval)."}, []string{"outcome"})
	m.tableFull = prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_rls_lease_table_full_total",
		Help: "Windows decided by a strict check in Redis because this replica's lease table was full (250,000 buckets)."})
	reg.MustRegister(m.requests, m.descriptors, m.seconds, m.clamped, m.acquires, m.acquiresShared, m.leaseGranted, m.syncs, m.tableFull)
	return m
}

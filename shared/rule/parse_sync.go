package rule

import (
	"github.com/tidwall/gjson"

	"github.com/tollgate-rl/tollgate/shared/wire"
)

func parseSync(path string, v gjson.Result) (Sync, error) {
	s := Sync{
		IntervalMs: 100, TimeoutMs: 250, LeaseTTLMs: 60000, StaleMs: 10000, MaxBatch: 1000, MaxPending: 10000,
		ExpectedNodes: 1, BreakerFailures: 3, BreakerOpenMs: 1000, IdleTTLMs: 120000, TableSlots: 65536,
	}
	if !v.Exists() {
		return s, nil
	}
	o, err := parseObject(path, v, "cluster", "authority", "secret", "node", "interval_ms", "timeout_ms",
		"lease_ttl_ms", "stale_ms", "max_batch", "max_pending", "expected_nodes", "breaker_failures", "breaker_open_ms", "idle_ttl_ms", "table_slots")
	if err != nil {
		return s, err
	}
	// The fields are independent: every mistake among them is reported.
	var errs errList
	strs := []struct {
		name string
		dst  *string
		max  int
	}{
		{"cluster", &s.Cluster, 256},
		{"authority", &s.Authority, 256},
		{"secret", &s.Secret, 1024},
		{"node", &s.Node, wire.MaxStringLen},
	}
	for _, f := range strs {
		if fv := o.get(f.name); fv.Exists() {
			*f.dst, err = parseToken(o.at(f.name), fv, f.max)
			errs.add(err)
		}
	}
	if s.Authority == "" {
		s.Authority = s.Cluster
	}
	ints := []struct {
		name   string
		dst    *int64
		lo, hi int64
	}{
		{"interval_ms", &s.IntervalMs, 10, 60000},
		{"timeout_ms", &s.TimeoutMs, 1, 60000},
		{"lease_ttl_ms", &s.LeaseTTLMs, 1, 600000},
		{"stale_ms", &s.StaleMs, 10, 600000},
		{"max_batch", &s.MaxBatch, 1, wire.MaxDeltas},
		{"max_pending", &s.MaxPending, 1, 1_000_000},
		{"expected_nodes", &s.ExpectedNodes, 1, 10000},
		{"breaker_failures", &s.BreakerFailures, 1, 1000},
		{"breaker_open_ms", &s.BreakerOpenMs, 1, 3_600_000},
		{"idle_ttl_ms", &s.IdleTTLMs, 1000, 7 * 24 * 3_600_000},
		{"table_slots", &s.TableSlots, 64, 1 << 22},
	}
	intsOK := true
	for _, f := range ints {
		if fv := o.get(f.name); fv.Exists() {
			v, err := parseInt(o.at(f.name), fv, f.lo, f.hi)
			if errs.add(err) {
				intsOK = false
				continue
			}
			*f.dst = v
		}
	}
	if !intsOK {
		// The checks between fields below would compare with a default.
		return s, errs.err()
	}
	// A lease that expires before the next tick could ever renew it would make every
	// node drop its lease between syncs.
	if s.LeaseTTLMs < s.IntervalMs {
		errs.add(fieldError(o.at("lease_ttl_ms"), "must be >= sync.interval_ms ("+itoa(s.IntervalMs)+"), got "+itoa(s.LeaseTTLMs)))
	}
	if s.StaleMs < s.IntervalMs {
		errs.add(fieldError(o.at("stale_ms"), "must be >= sync.interval_ms ("+itoa(s.IntervalMs)+"), got "+itoa(s.StaleMs)))
	}
	if o.get("stale_ms").Exists() {
		// A configuration that bounds staleness asks for that freshness of usage in the
		// admin API, leases or not (RATIONALE.md §2).
		s.StaleLeasedMs = s.StaleMs
	}
	return s, errs.err()
}

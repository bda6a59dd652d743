package lease

import "github.com/tollgate-rl/tollgate/shared/wire"

// SlowLeaseGaps: a gateway uses a lease for at least this many of its key's mean gaps
// between requests (UseUs), so that a slow key's lease outlives the key's gap.
//
// A gateway's lease_ttl_ms (1 s as shipped) caps how long it uses any lease, whatever
// validity the service grants. A key that comes back every second or two then finds
// its lease ended at nearly every request: the request is admitted on the cold-start
// allowance and reported on its own, and the lease the reply brings ends before the
// next request again — a report (a Redis delta) per request, and a request held for an
// acquire whenever the small lease a slow key is granted runs dry within its second
// (BENCHMARKS.md §13: 10,000 keys each back about every 1.3 s, 60.5 % of the requests
// admitted cold, 2.1 % held). Used for eight of its gaps, its lease is renewed about
// once per six requests (the renewal is asked for in the lease's last two seconds).
// A lease is a reservation (RATIONALE.md §2): using it longer within the validity the
// service granted admits nothing more; what it costs is that permits a slow key does
// not use stay reserved until they are reported back, at most that validity.
const SlowLeaseGaps = 8

// UseUs is how long, from the reply's application, a gateway uses the lease the
// service granted on delta d (its own report): lease_ttl_ms (ttlUs), or SlowLeaseGaps
// of the key's mean gap between requests over the period d reports when that is longer,
// at most maxUs (the staleness bound, which consumption waits unreported at most). A
// hot key's gap is short: its leases keep lease_ttl_ms. A first report (ElapsedMs 0)
// says nothing of the gap. The service's own validity still caps the lease.
func UseUs(d *wire.Delta, ttlUs, maxUs int64) int64 {
	count := int64(d.Leased) + int64(d.Over) + int64(d.Rejected) + int64(d.RateUsed)
	if count <= 0 || d.ElapsedMs == 0 {
		return ttlUs
	}
	gap := int64(d.ElapsedMs) * 1000 / count
	return max(ttlUs, min(SlowLeaseGaps*gap, maxUs))
}

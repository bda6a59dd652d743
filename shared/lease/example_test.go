package lease_test

import (
	"fmt"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// A gateway decides from a lease of the global quota: its first requests of a key are
// admitted on the cold-start allowance, the sync reports them, the service (here its
// Go twin, lease.Sync, on an in-memory bucket; Redis runs the same logic in Lua)
// answers with a lease, and the next requests are decided from that lease on the
// gateway alone, with no call to the service.
func Example() {
	p := algo.Params{Kind: algo.TokenBucket, Limit: 100, WindowUs: 60_000_000} // 100 per minute
	env := lease.Env{Sync: true, Healthy: true, IntervalUs: 100_000, RenewUs: 2_000_000,
		ColdAllowance: lease.ColdAllowance(p, 1, 0)} // a fleet of one gateway
	now := int64(1_700_000_000_000_000) // the gateway's clock, µs

	var rec lease.Record // the bucket's record in the gateway's shared data
	rec, d := lease.Decide(rec, p, now, 1, env)
	fmt.Println("first request:", d.Allowed, "cold:", d.Cold)

	// The next sync cuts the bucket's consumption into the batch...
	delta := wire.Delta{Key: "alice", Rule: "api", Algo: uint8(p.Kind), Limit: uint32(p.Limit), WindowMs: uint32(p.WindowUs / 1000)}
	rec = lease.Cut(rec, p, now, 1, &delta)
	// ...the service charges it and grants a lease...
	var bucket lease.Bucket
	var pen lease.Penalty
	res := lease.Sync(&bucket, &pen, &delta, now, lease.DefaultSyncConfig)
	var st wire.State
	res.Fill(&st)
	fmt.Println("service: remaining", st.Remaining, "lease", st.Lease)
	// ...and the reply lands in the record.
	now += 5_000 // 5 ms round trip
	rec, _ = lease.ApplyReply(rec, &st, &delta, 1, now)

	// From now on the lease decides, locally.
	for i := 0; i < 3; i++ {
		rec, d = lease.Decide(rec, p, now, 1, env)
		fmt.Println("request:", d.Allowed, "from the lease:", d.Leased, "left:", rec.LeaseLeft)
	}
	// Output:
	// first request: true cold: true
	// service: remaining 50 lease 49
	// request: true from the lease: 1 left: 48
	// request: true from the lease: 1 left: 47
	// request: true from the lease: 1 left: 46
}

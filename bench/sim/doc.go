// Package sim is a deterministic discrete-event simulation of a Tollgate fleet: N
// gateways of W workers each, deciding with the real node-side lease logic
// (shared/lease.Decide, ApplyReply) against per-gateway shared records, flushing their
// deltas through a lossy, delayed network to a sync service that applies them with the
// real Go twin of the Lua lease script (shared/lease.Sync). It exists because the bounds
// of RATIONALE.md §3 depend on fleet size, sync interval, latency and traffic shape in
// ways no unit test of one side can show, and the e2e suite cannot run 20 gateways for a
// minute of traffic in a test budget. A virtual clock (int64 µs) drives everything, so a
// run is a pure function of its Config: the same seed gives the same Result, bit for bit.
//
// # What is modelled, and how closely
//
// Gateway side, mirroring filter/plugin (sync.go, decide.go) and sharing its breaker (shared/lease.Breaker):
//   - one lease.Record per bucket per gateway, stored encoded (lease.AppendRecord) as in
//     Envoy shared data, so the millisecond rounding of the record applies; every worker
//     of a gateway decides against it (a VM is single threaded and the simulation runs one
//     event at a time, so the filter's CAS loop always succeeds first time);
//   - per worker: a pending delta per bucket (Leased/Over/Returned/Rejected/Early), at
//     most MaxPending buckets, cut into one batch of at most MaxBatch deltas with the next
//     seq; at most one batch in flight, resent unchanged until acknowledged; a flush on
//     every tick (its phase is random per worker) and an early flush when an admitted
//     decision asks for one (lease.Decision.Flush), as flushIfAsked does (a rejected
//     decision's Flush is ignored: decide.go returns before flushIfAsked);
//   - per worker: the circuit breaker (BreakerFailures consecutive failures open it for
//     BreakerOpen, then one half-open probe), lease.Env.Healthy from it, and Env.Nodes
//     from the last reply (ExpectedNodes before the first);
//   - each gateway's clock is the simulated clock plus a constant skew; nothing but the
//     records' local times ever sees it.
//
// Network: each callout's one-way latencies are drawn independently (Latency); a callout
// is lost with probability Loss, half of the losses on the way up (never applied), half
// on the way back (applied, reply lost); a reply that would arrive after Timeout is a
// failure at Timeout (Envoy resets the call), although the service applied the batch.
// During an Outage window the service answers 503 to every batch that reaches it.
//
// Service side: internal/memservice, the in-memory backend that answers every batch as
// ratelimit/store does (internal/backendtest runs one conformance suite on both and
// compares their answers field for field): every delta of a batch is applied with one
// lease.SyncNode at the service's clock, which is the simulated clock; the result becomes
// a wire.State with lease.SyncResult.Fill (as the service does); Reply.Nodes counts the
// gateways as the store does — once their syncs span the probation (1 s), while they
// synced within FleetWindow, refreshed once a second; buckets and penalty records expire
// with the TTLs lease.lua sets. Unless ColdFleet is set the gateways heartbeat for the
// three seconds before the run, so the service counts the fleet from the start, as a
// running service does. The batch's cost is counted as store.Apply incurs it: deltas
// grouped into script calls of at most 100 (per hash slot, store.Slot, on a cluster of
// Shards shards), one pipeline, one round trip per shard touched.
//
// Not modelled: strict rules (only the lease path), fail-closed rules (all decisions are
// fail-open), shared-data slot eviction (records are never evicted), CAS contention, rule
// changes, clients honouring Retry-After (traffic
// is open-loop), and SlidingWindowLog (its state does not fit a fixed record slot).
//
// # Metrics
//
// Every request is also decided by a reference: one perfect limiter per key (algo.Decide
// on a single state at the simulated time of the request) over the merged request stream
// of all gateways.
//
// Over-admission. For each key the fleet's admissions are fed, unconditionally and at
// their simulated times, into a shadow bucket with the rule's parameters (algo.Take). For
// a token bucket of capacity C refilling at r per µs, starting full, the shadow's debt at
// time t is
//
//	debt(t) = max over s ≤ t of ( A(s,t] − C − r·(t−s) )
//
// where A(s,t] counts the fleet's admissions in (s,t]: the number of permits by which the
// fleet exceeded what any perfect token bucket could admit over the worst window ending
// at t. Over-admission of a key is max over t of debt(t), and OverAdmissionPct is the
// worst key's over-admission as a percentage of C ("limit + x %"). For FixedWindow the
// same construction measures the worst window's count above Limit. It is 0 exactly when
// the fleet's admissions, taken as a whole, would have been legal for one limiter.
//
// False rejections. A request the fleet rejected while the reference admitted it.
// FalseRejectionPct is their number as a percentage of the requests the reference
// admitted (so a client whose every request a perfect limiter admits sees exactly this
// fraction of 429s it did not deserve). They are split by cause (lease and overdraft
// spent, progressive penalty, degraded local decision, cold start). For a client above
// its limit the fleet and the reference admit about as many requests but different ones,
// so there the per-request comparison says little: compare Admitted with RefAdmitted.
//
// Causes (Config.Explain, explain.go). Each request a gateway held for the service is
// counted by what its record said just before (no record on that gateway, never
// answered, lease period ended, valid lease ran dry, an acquire already out), and each
// false rejection of a calm key by what the service's bucket and every gateway's record
// said at that moment: the bucket spent as charged, reserved by leases other gateways
// hold unused, reserved by leases used but not reported yet, or holding unreserved room
// again (the refusal came from an answer that counted others' leases as taken).
//
// Cost. DeltasPerSec counts bucket updates (one lease.Sync, i.e. one pass of lease.lua's
// body, each); RedisOpsPerSec the script calls that carry them; RoundTripsPerSec the
// pipelines, one per shard a batch touches. Payload bytes are the exact sizes of the
// wire.AppendBatch and wire.AppendReply encodings of what was sent (resent batches and
// replies lost on the way included).
//
// # Regimes
//
// Regimes (regimes.go) are the traffic shapes a 16-gateway fleet is held to, each with
// its bounds: clients at 90 % of their limit, bursty clients, cold starts of keys at or
// in bursts above their limit, and the Realistic traffic of a public API (Zipf
// popularity over 100,000 keys, sessions, keys arriving during the run). `make sim`
// (tollgate-sim -regimes) prints each bound met or missed; BENCHMARKS.md §11 has them.
package sim

// Package backend is the contract between the sync service and what holds its buckets:
// Apply a gateway's batch (the lease script's semantics, RATIONALE.md §2) and say
// whether it answers. ratelimit/store implements it on Redis (the product);
// internal/memservice implements it in Go memory for the fleet simulation and the
// filter's native tests. internal/backendtest is one conformance suite both run, so the
// two cannot drift.
//
// It lives under internal/ rather than ratelimit/ because the in-memory backend
// implements it and internal/ never imports ratelimit/: the service (ratelimit/service)
// and both backends import it downwards.
package backend

import (
	"context"
	"errors"
	"time"

	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Backend applies batches. It is what ratelimit/service uses on the batch path
// (/v1/sync, /v1/check, acquires, heartbeats) and nothing more.
//
// The service's other uses of Redis stay on *store.Store and out of this interface:
// usage and reset (the admin API reads and deletes Redis keys by pattern and the
// registry of buckets, tg:params), rule sets (ratelimit/rules) and hot-key lists
// (ratelimit/top) share the store's Redis client, and the per-batch deadline comes from
// the store's Redis timeouts. None of them is part of applying a batch, and a backend
// without Redis could only fake them.
type Backend interface {
	// Apply applies b's deltas as o says and answers every delta (Outcome.States, in
	// order). A batch without a node is refused with an error wrapping ErrInvalid; deltas
	// that could not be applied make the error wrap ErrUnavailable (the gateway resends
	// the batch, which is idempotent with o.Idempotent).
	Apply(ctx context.Context, b *wire.Batch, o Options) (*Outcome, error)
	// Ping reports whether the backend answers (readiness, and a heartbeat's answer:
	// the service vouches for gateways' leases only while it does).
	Ping(ctx context.Context) error
}

// ErrInvalid is wrapped by batch validation errors (HTTP 400).
var ErrInvalid = errors.New("invalid batch")

// ErrUnavailable is wrapped when some deltas could not be applied (HTTP 503; the
// gateway retries the same batch, which is idempotent).
var ErrUnavailable = errors.New("redis unavailable")

// MaxPerCall bounds the deltas of one script call: enough to amortize the call, few
// enough that one call blocks Redis for about a millisecond at most. It is part of the
// contract, not only of the store: a batch's idempotency records are kept per call (per
// chunk of MaxPerCall deltas on one Redis node), so a backend cuts batches the same way.
const MaxPerCall = 100

// Options select how Apply treats a batch.
type Options struct {
	// Idempotent records the batch per (node, seq) so that a replay changes nothing
	// (sync batches); checks and acquires, answered only once, are not recorded.
	Idempotent bool
	// NoLease: grant no lease (gateways on the previous protocol cannot hold one).
	NoLease bool
	// Refuse, when set, may refuse a delta the backend would accept (the service's rule
	// set): it returns the reason, or "".
	Refuse func(d *wire.Delta) string
	// StoreKey, when set, is the form a caller key takes in storage (the service's keyed
	// hash): every bucket, penalty and lease record of the delta is named by it; the
	// states answer with the key as sent.
	StoreKey func(key string) string
	// NoLearn: record nothing of the batch in the registry of buckets (tg:params). A
	// service with a rule set names every bucket from it, and what a gateway sends must
	// not fill a registry the admin API depends on. (A backend without the registry has
	// nothing to record either way.)
	NoLearn bool
}

// Outcome is the result of one batch.
type Outcome struct {
	// States answers Deltas one to one, in order.
	States []wire.State
	// Results are the raw script results, one per delta (zero for refused deltas).
	Results []lease.SyncResult
	// ServerTimeUs is the latest server time of the batch's script calls (a replayed
	// call's is the time it was first applied); 0 when no delta was applied.
	ServerTimeUs int64
	// Nodes is the fleet size (gateways seen syncing within the fleet window).
	Nodes uint32
	// Refused is how many deltas were refused (StateRefused).
	Refused int
	// Failed is how many deltas could not be applied (then Apply's error is
	// ErrUnavailable).
	Failed int
	// ShardErrors are the script calls that failed: one per Redis node (and chunk) whose
	// deltas could not be applied, so the service can log which part of the keyspace fails.
	ShardErrors []ShardError
}

// ShardError is a failed script call: Slot is a hash slot of the Redis node it went to
// (0 on a standalone Redis), Deltas how many deltas it carried.
type ShardError struct {
	Slot   int
	Deltas int
	Err    error
}

// Screen starts the Outcome of b: every state names its delta's bucket, and the deltas
// no backend may apply are answered StateRefused with their reason — lease.Refusal, then
// o.Refuse, then a bucket that appears twice in the batch (a gateway reports a bucket
// once per batch; a second delta under the same seq would be taken for a replay of the
// first). It returns which deltas are to be applied. Both backends call it, so they
// refuse the same deltas for the same reasons.
func Screen(b *wire.Batch, o *Options) (*Outcome, []bool) {
	out := &Outcome{
		States:  make([]wire.State, len(b.Deltas)),
		Results: make([]lease.SyncResult, len(b.Deltas)),
	}
	ok := make([]bool, len(b.Deltas))
	type bucket struct {
		key, rule, tier string
		window          uint8
	}
	seen := make(map[bucket]struct{}, len(b.Deltas))
	for i := range b.Deltas {
		d := &b.Deltas[i]
		st := &out.States[i]
		st.Key, st.Rule, st.Window = d.Key, d.Rule, d.Window
		why := lease.Refusal(d)
		if why == "" && o.Refuse != nil {
			why = lease.TruncateReason(o.Refuse(d))
		}
		k := bucket{d.Key, d.Rule, d.Tier, d.Window}
		if _, dup := seen[k]; dup && why == "" {
			why = "bucket appears twice in the batch"
		}
		seen[k] = struct{}{}
		if why != "" {
			st.Flags, st.Reason = wire.StateRefused, why
			out.Refused++
			continue
		}
		ok[i] = true
	}
	return out, ok
}

// Fleet counting (Outcome.Nodes, which sizes the gateways' cold-start allowances and
// first leases): the defaults of both backends. A gateway counts once its syncs span
// the probation, for as long as it synced within the window; at most the join rate of
// gateways join per second and the fleet holds at most its cap, so node ids a client
// invents cannot raise the size at once nor beyond the cap (ratelimit/store/fleet.go
// says how). The count is refreshed once per FleetRefresh: a batch is answered with the
// count of the last refresh.
const (
	DefaultFleetWindow    = 5 * time.Second
	DefaultFleetProbation = time.Second
	DefaultFleetJoinRate  = 50
	DefaultFleetMaxNodes  = 10_000
	FleetRefresh          = time.Second
	// FleetMaxCandidates bounds the ids one refresh offers to the fleet (the rest wait
	// for the next): the join rate admits few anyway.
	FleetMaxCandidates = 1000
)

// DefaultIdempotencyTTL is how long a gateway's record of its last batch (per Redis
// node) lives after that batch: a batch resent later than this is applied again.
const DefaultIdempotencyTTL = 60 * time.Second

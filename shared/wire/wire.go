// Package wire is the sync protocol between the filter and the sync service: one Batch
// per Envoy per sync interval carries what its workers consumed on buckets whose lease
// needs attention, and a Reply with the authoritative global state and the gateway's
// lease comes back (RATIONALE.md §2).
//
// The encoding is a hand-written, versioned binary format (uvarints and length-prefixed
// strings) because the filter must decode it inside the Wasm VM without reflection and
// with hard size limits; encoding/json would pull reflection into the filter and
// protobuf needs generated code and a runtime the TinyGo build cannot afford.
//
// # Format (Version 2)
//
// Every message starts with one Version byte. "uv" is an unsigned LEB128 varint
// (encoding/binary's Uvarint), "sv" a zig-zag signed varint (Varint), "u8" one raw byte,
// and "str" a uv length followed by that many bytes (any bytes; no UTF-8 requirement).
//
//	Batch: u8 Version, str Node, uv Seq, uv RulesVersion, str RulesTag, uv count, count × Delta
//	Delta: str Key, str Rule, str Tier, u8 Window, u8 Flags, uv Leased, uv Over,
//	       uv Returned, uv Held, uv Rejected, uv Early, uv Epoch, uv ElapsedMs,
//	       u8 Algo, uv Limit, uv WindowMs, uv Burst[, uv Want when Flags has FlagWant]
//	       [, uv Rate, uv RateUsed, uv RateEpoch, uv RateStock when Flags has FlagRate]
//	Reply: u8 Version, uv RulesVersion, str RulesTag, sv ServerTimeUs, uv Nodes,
//	       uv count, count × State
//	State: str Key, str Rule, u8 Window, u8 flags, sv Remaining, uv Lease, uv Held,
//	       uv Epoch, uv ValidMs, uv LowWater, uv ResetInMs, uv RetryInMs,
//	       uv PenaltyInMs, u8 PenaltyLevel, uv ServerMs, str Reason
//	       [, uv Rate, uv Stock when flags has StateRate]
//
// Version 1 (one batch per worker, leases kept per gateway in every bucket) is still
// decoded by the service so that gateways not yet upgraded keep limiting during a
// rolling upgrade; see v1.go.
//
// The encoding is canonical: decoders reject non-minimal varints, values that overflow
// their field, unknown flag bits and trailing bytes, so every message has exactly one
// encoding and Append(Decode(b)) == b, which makes the fuzz tests' round-trip property
// exact.
//
// Decoders check every claimed count and length against the bytes that remain before
// allocating anything, so a hostile or corrupt message costs at most its own size.
package wire

import "errors"

// Version is the first byte of every encoded Batch and Reply.
const Version = 2

// AlivePath is the service's liveness probe for gateways whose sync is slow (GET,
// answered 200 while the service and its Redis answer, 503 otherwise): a sync that is
// slow while it answers 200 does not make the gateway degraded; one whose Redis has
// stalled does, as if the service had. Kubernetes probes /healthz, which answers
// without Redis, so a Redis outage never restarts the service.
const AlivePath = "/v1/sync/alive"

// Hard limits enforced by both Encode and Decode.
const (
	MaxDeltas    = 4096 // entries per batch / states per reply
	MaxStringLen = 256  // key, rule id, tier, node id
	MaxTagLen    = 64   // rules tag, refusal reason
	MaxBatchSize = 1 << 20
)

// Delta flags.
const (
	// FlagStrict asks the service for a synchronous decision of Over permits against
	// what the bucket holds beyond every outstanding lease; the reply's State.Allowed says
	// whether they were taken. A strict delta never gets a lease.
	FlagStrict uint8 = 1 << iota
	// FlagWant says the delta carries Want after Burst (an acquire asking for the demand
	// that waits for it). Services before it refuse the bit as unknown.
	FlagWant
	// FlagDegraded says Over includes permits admitted while the gateway could not reach
	// the service (fail-open). They are charged only up to what the global bucket holds:
	// that over-admission already happened during the outage, and charging it as debt
	// afterwards would lock out callers who are within their limit (RATIONALE.md §3).
	FlagDegraded
	// FlagAcquire is a paused request asking for Over permits now (decided like
	// FlagStrict) together with a lease for the gateway.
	FlagAcquire
	// FlagRate says the gateway takes rate leases on this bucket (RATIONALE.md §3, keys
	// at their limit) and that the delta carries Rate, RateUsed and RateEpoch after
	// Want: the rate it held until this report (which the service stops counting), what
	// it admitted out of that rate's accrual (charged already, counted only as demand)
	// and the epoch the rate was granted in. Services
	// before it refuse the bit as unknown, as with FlagWant: the service is upgraded
	// first.
	FlagRate

	deltaFlags = FlagStrict | FlagWant | FlagDegraded | FlagAcquire | FlagRate
)

// State flags.
const (
	// StateAllowed answers a FlagStrict or FlagAcquire delta.
	StateAllowed uint8 = 1 << iota
	// StateRefused: the delta was not applied; Reason says why (unknown rule, parameters
	// the service does not accept). The other deltas of the batch were applied.
	StateRefused
	// StateReplay: the delta belongs to a batch the service had applied already; the
	// lease fields repeat what the first application granted and ServerMs is its time.
	StateReplay
	// StateRate says the state carries Rate and Stock after Reason: the rate lease
	// granted to the gateway and the stock it starts with. The service sets it only in answer to a FlagRate delta.
	StateRate

	stateFlags = StateAllowed | StateRefused | StateReplay | StateRate
)

// Batch is what one gateway (one Envoy, whatever its number of workers) sends per sync.
type Batch struct {
	Node string // gateway id: leases and idempotency are per node
	// Seq is the gateway's batch id; (Node, Seq) is the idempotency key. A retried batch
	// carries the same Seq and the same Deltas. Seqs only grow (they start at the
	// gateway's start time in µs).
	Seq          uint64
	RulesVersion uint64 // rules version the gateway enforces
	RulesTag     string // identity of that rule set (survives a Redis wipe)
	Deltas       []Delta
}

// Delta is one (key, rule, window) bucket's activity since the gateway last reported it.
type Delta struct {
	Key    string // caller key (the Redis hash tag)
	Rule   string // rule id
	Tier   string // tier the gateway resolved for the caller ("" for none)
	Window uint8  // index into the rule's windows
	Flags  uint8
	// Leased is what was admitted out of the gateway's lease (reserved at the service).
	Leased uint32
	// Over is what was admitted outside any lease (degraded mode); the service charges
	// it to the global bucket. With FlagStrict/FlagAcquire it is the cost asked for.
	Over uint32
	// Returned is lease the gateway gives back (it expired locally or is not needed).
	Returned uint32
	// Held is the lease the gateway still holds (dated Epoch) and keeps; the service
	// renews its reservation.
	Held uint32
	// Rejected counts requests answered 429 locally; Early counts the subset that
	// arrived before the Retry-After they had been given (the penalty signal).
	Rejected uint32
	Early    uint32
	// Epoch is the lease epoch the service gave with the gateway's lease (0: none).
	Epoch uint32
	// ElapsedMs is the time over which Leased+Over+Rejected were counted (since the
	// bucket's previous report): the gateway's demand is their sum over it.
	ElapsedMs uint32
	// Params the rule had at the gateway (the service creates the bucket from them and,
	// when it holds rules of its own, checks them).
	Algo     uint8
	Limit    uint32
	WindowMs uint32
	Burst    uint32
	// Want (with FlagWant, on an acquire) is the cost of the gateway's requests that
	// wait for the acquire beyond Over: the service's grant covers it if the bucket holds
	// it unreserved, before the share rules size the rest (RATIONALE.md §2).
	Want uint32
	// Rate (with FlagRate) is the rate lease, in milli-permits per second, the gateway
	// held when it cut this report; it stopped accruing it then, and the service stops
	// counting it. RateUsed is what the gateway admitted out of that rate since its last
	// report: charged as it accrued, so only demand here. RateEpoch is the lease epoch
	// of that rate (it may differ from Epoch, the count lease's, when an acquire's lease
	// of another epoch is held beside it).
	Rate, RateUsed, RateEpoch uint32
	// RateStock is what that rate's stock held when the report was cut: the gateway
	// keeps it (without accruing) until the reply, which says how much of it the new
	// rate lease covers.
	RateStock uint32
}

// Reply is the service's answer to a Batch.
type Reply struct {
	RulesVersion uint64 // current rules version at the service
	RulesTag     string // and its identity
	ServerTimeUs int64  // Redis TIME when the batch was applied (informational only)
	Nodes        uint32 // gateways seen syncing recently (fleet size: cold-start allowances, first leases)
	States       []State
}

// State is the authoritative state of one bucket after the batch, one per Delta in
// order. All times are durations relative to the moment the service answered, so the
// filter converts them to its own clock on receipt and never compares clocks.
type State struct {
	Key    string
	Rule   string
	Window uint8
	Flags  uint8
	// Remaining is the global unreserved quota after every outstanding lease (may be
	// negative: debt from overage).
	Remaining int64
	// Lease is the new lease granted to the gateway; Held is what the service still
	// reserves of the lease the gateway reported (≤ Delta.Held). The gateway's lease is
	// Held (less what it consumed since the batch was cut) plus Lease, dated Epoch, and
	// usable for ValidMs.
	Lease    uint32
	Held     uint32
	Epoch    uint32
	ValidMs  uint32
	LowWater uint32 // report again when the lease falls to this
	// ResetInMs: until the global bucket is full again with what has been charged
	// (rounded down: the gateway adds it to its own clock); RetryInMs: until one permit
	// (or, refused, the cost asked for) is available, outstanding leases counted as taken.
	ResetInMs    uint32
	RetryInMs    uint32
	PenaltyInMs  uint32 // remaining progressive-penalty cooldown (0 if none)
	PenaltyLevel uint8  // how many times the cooldown has grown
	// ServerMs is the server time (Unix ms) the state was computed at: a gateway never
	// lets an older state overwrite a newer one of the same bucket.
	ServerMs uint64
	Reason   string // why a StateRefused delta was refused
	// Rate (with StateRate) is the rate lease granted, in milli-permits per second: the
	// gateway's share of the bucket's refill, accrued locally while the lease is valid
	// (RATIONALE.md §3, keys at their limit). Stock is what the lease starts with.
	Rate, Stock uint32
}

// Allowed reports the StateAllowed flag.
func (s *State) Allowed() bool { return s.Flags&StateAllowed != 0 }

// Error kinds, for errors.Is. Every error this package returns is an *Error wrapping
// one of them.
var (
	// ErrMalformed: the input is not a valid encoding (truncated, wrong version,
	// trailing bytes, overflowing or non-minimal varint, unknown flag bits).
	ErrMalformed = errors.New("wire: malformed message")
	// ErrLimit: a count, a string length or the message size exceeds a hard limit
	// (on encode or decode).
	ErrLimit = errors.New("wire: limit exceeded")
	// ErrVersion: the message is of a version this decoder does not read.
	ErrVersion = errors.New("wire: unsupported version")
)

// Error names the field that failed and why, e.g. "wire: delta[3].key: length 300 > 256".
type Error struct {
	Field  string // "node", "deltas", "delta[3].key", "state[0].remaining", "batch", ...
	Reason string // "length 300 > 256", "truncated", ...
	Kind   error  // ErrMalformed, ErrLimit or ErrVersion
}

func (e *Error) Error() string { return "wire: " + e.Field + ": " + e.Reason }

// Unwrap returns the error kind.
func (e *Error) Unwrap() error { return e.Kind }

// PeekVersion returns the version byte of an encoded message (0 if empty).
func PeekVersion(data []byte) byte {
	if len(data) == 0 {
		return 0
	}
	return data[0]
}

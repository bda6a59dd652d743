// Package wire is the sync protocol between the filter and the sync service: a Batch of
// consumed deltas goes up every sync interval, a Reply with the authoritative global
// state and this node's lease comes back.
//
// The encoding is a hand-written, versioned binary format (uvarints and length-prefixed
// strings) because the filter must decode it inside the Wasm VM without reflection and
// with hard size limits; encoding/json would pull reflection into the filter and
// protobuf needs generated code and a runtime the TinyGo build cannot afford.
//
// # Format (Version 1)
//
// Every message starts with one Version byte. "uv" is an unsigned LEB128 varint
// (encoding/binary's Uvarint), "sv" a zig-zag signed varint (Varint), "u8" one raw byte,
// and "str" a uv length followed by that many bytes (any bytes; no UTF-8 requirement).
//
//	Batch: u8 Version, str Node, uv Worker, uv Seq, uv RulesVersion, uv count, count × Delta
//	Delta: str Key, str Rule, u8 Window, u8 Flags, uv Leased, uv Over, uv Returned,
//	       uv Rejected, uv Early, u8 Algo, uv Limit, uv WindowMs, uv Burst
//	Reply: u8 Version, uv RulesVersion, sv ServerTimeUs, uv Nodes, uv count, count × State
//	State: str Key, str Rule, u8 Window, u8 flags (bit 0: Allowed; other bits zero),
//	       sv Remaining, uv Lease, uv LeaseHeld, uv ResetInMs, uv RetryInMs,
//	       uv PenaltyInMs, u8 PenaltyLevel
//
// The encoding is canonical: decoders reject non-minimal varints, values that overflow
// their field, unknown flag bits and trailing bytes, so every message has exactly one
// encoding and Append(Decode(b)) == b. That keeps stored replies (the idempotency cache)
// byte-comparable and makes the fuzz tests' round-trip property exact.
//
// Decoders check every claimed count and length against the bytes that remain before
// allocating anything, so a hostile or corrupt message costs at most its own size.
package wire

import "errors"

// Version is the first byte of every encoded Batch and Reply.
const Version = 1

// Hard limits enforced by both Encode and Decode.
const (
	MaxDeltas    = 4096 // entries per batch / states per reply
	MaxStringLen = 256  // key, rule id, node id
	MaxBatchSize = 1 << 20
)

// Delta flags.
const (
	// FlagStrict asks the service for a synchronous decision of Over permits
	// (the rule is strict): the reply's State.Allowed says whether they were taken.
	FlagStrict uint8 = 1 << iota
	// FlagNew marks a bucket the node has just created (no lease yet).
	FlagNew
	// FlagDegraded says Over includes permits admitted while the node could not reach
	// the service (fail-open). They are charged only up to what the global bucket holds:
	// that over-admission already happened during the outage, and charging it as debt
	// afterwards would lock out callers who are within their limit (RATIONALE §3).
	FlagDegraded
)

// Batch is what one worker of one gateway sends per sync.
type Batch struct {
	Node   string // gateway id (leases are per node, shared by its workers)
	Worker uint32
	// Seq is the worker's monotonic batch id; (Node, Worker, Seq) is the idempotency key.
	// A retried batch carries the same Seq and the same Deltas.
	Seq          uint64
	RulesVersion uint64 // rules version the node enforces
	Deltas       []Delta
}

// Delta is one (key, rule, window) bucket's activity since the worker's last flush.
type Delta struct {
	Key    string // caller key (the Redis hash tag)
	Rule   string // rule id
	Window uint8  // index into the rule's windows
	Flags  uint8
	// Leased is what was admitted out of the node's lease (already reserved in Redis).
	Leased uint32
	// Over is what was admitted outside any lease (cold start, overdraft, degraded mode);
	// the service charges it to the global bucket.
	Over uint32
	// Returned is unused lease the node gives back (expired or dropped locally).
	Returned uint32
	// Rejected counts requests answered 429 locally; Early counts the subset that
	// arrived before the Retry-After they had been given (the penalty signal).
	Rejected uint32
	Early    uint32
	// Params the rule had at the node (so the service applies the rule version the node
	// enforced and can create the bucket without a rules lookup).
	Algo     uint8
	Limit    uint32
	WindowMs uint32
	Burst    uint32
}

// Reply is the service's answer to a Batch.
type Reply struct {
	RulesVersion uint64 // current rules version at the service
	ServerTimeUs int64  // Redis TIME when the batch was applied (informational only)
	Nodes        uint32 // gateways seen syncing recently (fleet size, for cold starts)
	States       []State
}

// State is the authoritative state of one bucket after the batch. All times are
// durations relative to the moment the service answered, so the filter converts them to
// its own clock on receipt and never compares clocks.
type State struct {
	Key    string
	Rule   string
	Window uint8
	// Allowed answers a FlagStrict delta.
	Allowed bool
	// Remaining is the global unreserved quota (may be negative: debt from overage).
	Remaining int64
	// Lease is the increment granted to this node (add to the local lease);
	// LeaseHeld is the node's total outstanding lease as the service sees it.
	Lease        uint32
	LeaseHeld    uint32
	ResetInMs    uint32 // until the global bucket is full again / the window ends
	RetryInMs    uint32 // until one permit is available globally (0 if available now)
	PenaltyInMs  uint32 // remaining progressive-penalty cooldown (0 if none)
	PenaltyLevel uint8  // how many times the cooldown has grown
}

// Error kinds, for errors.Is. Every error this package returns is an *Error wrapping
// one of them.
var (
	// ErrMalformed: the input is not a valid encoding (truncated, wrong version,
	// trailing bytes, overflowing or non-minimal varint, unknown flag bits).
	ErrMalformed = errors.New("wire: malformed message")
	// ErrLimit: a count, a string length or the message size exceeds a hard limit
	// (on encode or decode).
	ErrLimit = errors.New("wire: limit exceeded")
)

// Error names the field that failed and why, e.g. "wire: delta[3].key: length 300 > 256".
type Error struct {
	Field  string // "node", "deltas", "delta[3].key", "state[0].remaining", "batch", ...
	Reason string // "length 300 > 256", "truncated", ...
	Kind   error  // ErrMalformed or ErrLimit
}

func (e *Error) Error() string { return "wire: " + e.Field + ": " + e.Reason }

// Unwrap returns the error kind (ErrMalformed or ErrLimit).
func (e *Error) Unwrap() error { return e.Kind }

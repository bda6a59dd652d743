package wire

import (
	"encoding/binary"
	"slices"
)

// Version 1 of the protocol: one batch per worker of a gateway, leases kept per gateway
// inside every bucket. The service still answers it so that gateways not yet upgraded
// keep limiting during a rolling upgrade (they get no leases from a Version 2 service and
// decide from their share of the global remaining, see ratelimit/README.md); nothing
// else uses it.
//
//	Batch: u8 1, str Node, uv Worker, uv Seq, uv RulesVersion, uv count, count × Delta
//	Delta: str Key, str Rule, u8 Window, u8 Flags, uv Leased, uv Over, uv Returned,
//	       uv Rejected, uv Early, u8 Algo, uv Limit, uv WindowMs, uv Burst
//	Reply: u8 1, uv RulesVersion, sv ServerTimeUs, uv Nodes, uv count, count × State
//	State: str Key, str Rule, u8 Window, u8 flags (bit 0: Allowed), sv Remaining,
//	       uv Lease, uv LeaseHeld, uv ResetInMs, uv RetryInMs, uv PenaltyInMs,
//	       u8 PenaltyLevel

// VersionV1 is the first byte of a Version 1 message.
const VersionV1 = 1

// Version 1 delta flags (strict, new, degraded).
const v1Flags = 1 | 2 | 4

// BatchV1 is a Version 1 batch.
type BatchV1 struct {
	Node         string
	Worker       uint32
	Seq          uint64
	RulesVersion uint64
	Deltas       []DeltaV1
}

// DeltaV1 is a Version 1 delta.
type DeltaV1 struct {
	Key, Rule                               string
	Window, Flags                           uint8
	Leased, Over, Returned, Rejected, Early uint32
	Algo                                    uint8
	Limit, WindowMs, Burst                  uint32
}

// ReplyV1 is a Version 1 reply.
type ReplyV1 struct {
	RulesVersion uint64
	ServerTimeUs int64
	Nodes        uint32
	States       []StateV1
}

// StateV1 is a Version 1 state.
type StateV1 struct {
	Key, Rule                                           string
	Window                                              uint8
	Allowed                                             bool
	Remaining                                           int64
	Lease, LeaseHeld, ResetInMs, RetryInMs, PenaltyInMs uint32
	PenaltyLevel                                        uint8
}

// DecodeBatchV1 decodes a Version 1 batch (strings share one allocation, as DecodeBatch).
func DecodeBatchV1(data []byte, b *BatchV1) error {
	if len(data) > MaxBatchSize {
		return sizeError("batch", len(data))
	}
	r := reader{data: data}
	if err := r.batchV1(nil); err != nil {
		return err
	}
	fill := reader{data: data, fill: true}
	fill.arena.Grow(r.strBytes)
	return fill.batchV1(b)
}

// DecodeReplyV1 decodes a Version 1 reply.
func DecodeReplyV1(data []byte, rep *ReplyV1) error {
	if len(data) > MaxBatchSize {
		return sizeError("reply", len(data))
	}
	r := reader{data: data}
	if err := r.replyV1(nil); err != nil {
		return err
	}
	fill := reader{data: data, fill: true}
	fill.arena.Grow(r.strBytes)
	return fill.replyV1(rep)
}

// AppendBatchV1 appends the Version 1 encoding of b.
func AppendBatchV1(dst []byte, b *BatchV1) ([]byte, error) {
	if err := checkString("", 0, "node", b.Node); err != nil {
		return dst, err
	}
	if err := checkCount("deltas", len(b.Deltas)); err != nil {
		return dst, err
	}
	for i := range b.Deltas {
		if err := checkString("delta", i, "key", b.Deltas[i].Key); err != nil {
			return dst, err
		}
		if err := checkString("delta", i, "rule", b.Deltas[i].Rule); err != nil {
			return dst, err
		}
	}
	dst = append(dst, VersionV1)
	dst = appendString(dst, b.Node)
	dst = binary.AppendUvarint(dst, uint64(b.Worker))
	dst = binary.AppendUvarint(dst, b.Seq)
	dst = binary.AppendUvarint(dst, b.RulesVersion)
	dst = binary.AppendUvarint(dst, uint64(len(b.Deltas)))
	for i := range b.Deltas {
		d := &b.Deltas[i]
		dst = appendString(dst, d.Key)
		dst = appendString(dst, d.Rule)
		dst = append(dst, d.Window, d.Flags)
		for _, v := range [...]uint32{d.Leased, d.Over, d.Returned, d.Rejected, d.Early} {
			dst = binary.AppendUvarint(dst, uint64(v))
		}
		dst = append(dst, d.Algo)
		for _, v := range [...]uint32{d.Limit, d.WindowMs, d.Burst} {
			dst = binary.AppendUvarint(dst, uint64(v))
		}
	}
	if len(dst) > MaxBatchSize {
		return dst, sizeError("batch", len(dst))
	}
	return dst, nil
}

// AppendReplyV1 appends the Version 1 encoding of r.
func AppendReplyV1(dst []byte, r *ReplyV1) ([]byte, error) {
	if err := checkCount("states", len(r.States)); err != nil {
		return dst, err
	}
	dst = slices.Grow(dst, 32+len(r.States)*48)
	dst = append(dst, VersionV1)
	dst = binary.AppendUvarint(dst, r.RulesVersion)
	dst = binary.AppendVarint(dst, r.ServerTimeUs)
	dst = binary.AppendUvarint(dst, uint64(r.Nodes))
	dst = binary.AppendUvarint(dst, uint64(len(r.States)))
	for i := range r.States {
		s := &r.States[i]
		if err := checkString("state", i, "key", s.Key); err != nil {
			return dst, err
		}
		dst = appendString(dst, s.Key)
		dst = appendString(dst, s.Rule)
		var flags byte
		if s.Allowed {
			flags = 1
		}
		dst = append(dst, s.Window, flags)
		dst = binary.AppendVarint(dst, s.Remaining)
		for _, v := range [...]uint32{s.Lease, s.LeaseHeld, s.ResetInMs, s.RetryInMs, s.PenaltyInMs} {
			dst = binary.AppendUvarint(dst, uint64(v))
		}
		dst = append(dst, s.PenaltyLevel)
	}
	return dst, nil
}

func (r *reader) batchV1(b *BatchV1) error {
	r.version(VersionV1)
	node := r.str("node")
	worker := r.u32("worker")
	seq := r.uvarint("seq")
	rulesVersion := r.uvarint("rules_version")
	n := r.count("deltas", 13)
	if r.err != nil {
		return r.err
	}
	var deltas []DeltaV1
	if b != nil {
		deltas = resize(b.Deltas, n)
	}
	r.item = "delta"
	for i := 0; i < n; i++ {
		r.idx = i
		d := DeltaV1{
			Key: r.str("key"), Rule: r.str("rule"), Window: r.byte("window"), Flags: r.flags("flags", v1Flags),
			Leased: r.u32("leased"), Over: r.u32("over"), Returned: r.u32("returned"),
			Rejected: r.u32("rejected"), Early: r.u32("early"), Algo: r.byte("algo"),
			Limit: r.u32("limit"), WindowMs: r.u32("window_ms"), Burst: r.u32("burst"),
		}
		if r.err != nil {
			return r.err
		}
		if b != nil {
			deltas[i] = d
		}
	}
	r.item = ""
	if err := r.end("batch"); err != nil {
		return err
	}
	if b != nil {
		*b = BatchV1{Node: node, Worker: worker, Seq: seq, RulesVersion: rulesVersion, Deltas: deltas}
	}
	return nil
}

func (r *reader) replyV1(rep *ReplyV1) error {
	r.version(VersionV1)
	rulesVersion := r.uvarint("rules_version")
	serverTime := r.varint("server_time_us")
	nodes := r.u32("nodes")
	n := r.count("states", 11)
	if r.err != nil {
		return r.err
	}
	var states []StateV1
	if rep != nil {
		states = resize(rep.States, n)
	}
	r.item = "state"
	for i := 0; i < n; i++ {
		r.idx = i
		s := StateV1{Key: r.str("key"), Rule: r.str("rule"), Window: r.byte("window")}
		s.Allowed = r.flags("flags", 1) != 0
		s.Remaining = r.varint("remaining")
		s.Lease, s.LeaseHeld = r.u32("lease"), r.u32("lease_held")
		s.ResetInMs, s.RetryInMs, s.PenaltyInMs = r.u32("reset_in_ms"), r.u32("retry_in_ms"), r.u32("penalty_in_ms")
		s.PenaltyLevel = r.byte("penalty_level")
		if r.err != nil {
			return r.err
		}
		if rep != nil {
			states[i] = s
		}
	}
	r.item = ""
	if err := r.end("reply"); err != nil {
		return err
	}
	if rep != nil {
		*rep = ReplyV1{RulesVersion: rulesVersion, ServerTimeUs: serverTime, Nodes: nodes, States: states}
	}
	return nil
}

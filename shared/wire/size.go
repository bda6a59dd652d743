package wire

// Worst-case sizes of the fixed parts, for SplitDeltas: a batch header whose Seq and
// RulesVersion take their longest varints, and a State whose numbers do.
const (
	maxBatchHeader = 1 + 10 + 10                                // version, seq, rules version (+ node, tag, count)
	maxReplyHeader = 1 + 10 + 10 + 5                            // version, rules version, server time, nodes (+ tag, count)
	maxStateFixed  = 1 + 1 + 10 + 10*5 + 1 + 10 + 1 + MaxTagLen // window, flags, remaining, 10 × u32 (rate and stock included), level, server ms, reason
)

// EncodedBatchSize is the exact number of bytes AppendBatch writes for b (whether or
// not b is within the limits).
func EncodedBatchSize(b *Batch) int {
	n := BatchHeaderSize(b.Node, b.Seq, b.RulesVersion, b.RulesTag, len(b.Deltas))
	for i := range b.Deltas {
		n += DeltaSize(&b.Deltas[i])
	}
	return n
}

// BatchHeaderSize is the number of bytes AppendBatchHeader writes.
func BatchHeaderSize(node string, seq, rulesVersion uint64, rulesTag string, n int) int {
	return 1 + stringSize(node) + uvarintLen(seq) + uvarintLen(rulesVersion) + stringSize(rulesTag) + uvarintLen(uint64(n))
}

// DeltaSize is the number of bytes d adds to an encoded Batch.
func DeltaSize(d *Delta) int {
	n := stringSize(d.Key) + stringSize(d.Rule) + stringSize(d.Tier) + 2 + 1
	for _, v := range [...]uint32{d.Leased, d.Over, d.Returned, d.Held, d.Rejected, d.Early, d.Epoch, d.ElapsedMs, d.Limit, d.WindowMs, d.Burst} {
		n += uvarintLen(uint64(v))
	}
	if d.Flags&FlagWant != 0 {
		n += uvarintLen(uint64(d.Want))
	}
	if d.Flags&FlagRate != 0 {
		n += uvarintLen(uint64(d.Rate)) + uvarintLen(uint64(d.RateUsed)) + uvarintLen(uint64(d.RateEpoch)) + uvarintLen(uint64(d.RateStock))
	}
	return n
}

// EncodedReplySize is the exact number of bytes AppendReply writes for r (whether or not
// r is within the limits).
func EncodedReplySize(r *Reply) int {
	n := 1 + uvarintLen(r.RulesVersion) + stringSize(r.RulesTag) + varintLen(r.ServerTimeUs) +
		uvarintLen(uint64(r.Nodes)) + uvarintLen(uint64(len(r.States)))
	for i := range r.States {
		n += StateSize(&r.States[i])
	}
	return n
}

// StateSize is the number of bytes s adds to an encoded Reply.
func StateSize(s *State) int {
	n := stringSize(s.Key) + stringSize(s.Rule) + 2 + varintLen(s.Remaining) + 1 +
		uvarintLen(s.ServerMs) + stringSize(s.Reason)
	for _, v := range [...]uint32{s.Lease, s.Held, s.Epoch, s.ValidMs, s.LowWater, s.ResetInMs, s.RetryInMs, s.PenaltyInMs} {
		n += uvarintLen(uint64(v))
	}
	if s.Flags&StateRate != 0 {
		n += uvarintLen(uint64(s.Rate)) + uvarintLen(uint64(s.Stock))
	}
	return n
}

// MaxStateSize is the longest a State for delta d can encode (every number at its
// longest, the longest reason): what the service's reply to d can cost, which the
// gateway must budget for when it sizes a batch (the service cannot split its answer).
func MaxStateSize(d *Delta) int {
	return stringSize(d.Key) + stringSize(d.Rule) + maxStateFixed
}

// MaxReplyHeader is the longest a Reply's header can encode with a tag of tagLen bytes
// and n states.
func MaxReplyHeader(tagLen, n int) int {
	return maxReplyHeader + uvarintLen(uint64(tagLen)) + tagLen + uvarintLen(uint64(n))
}

// SplitDeltas splits deltas so that head fits in one Batch sent by node: at most
// maxDeltas entries, and both the encoded Batch and the Reply the service sends back
// (one State per Delta, with every number at its longest) at most maxBytes bytes.
// Bounding the reply too matters because a State can encode longer than its Delta, and
// the service cannot split its answer.
//
// maxDeltas and maxBytes <= 0 or above the hard limits mean MaxDeltas and MaxBatchSize.
// The header is sized for the longest Seq and RulesVersion and the longest rules tag,
// so the split holds whatever sequence number the batch is given later. head is empty
// only when deltas is, or when the first delta alone cannot fit in maxBytes (never the
// case with the default maxBytes for deltas within MaxStringLen).
func SplitDeltas(node string, deltas []Delta, maxDeltas, maxBytes int) (head, tail []Delta) {
	if maxDeltas <= 0 || maxDeltas > MaxDeltas {
		maxDeltas = MaxDeltas
	}
	if maxBytes <= 0 || maxBytes > MaxBatchSize {
		maxBytes = MaxBatchSize
	}
	batch := maxBatchHeader + stringSize(node) + 1 + MaxTagLen
	reply := maxReplyHeader + 1 + MaxTagLen
	n := 0
	for n < len(deltas) && n < maxDeltas {
		d := &deltas[n]
		nextBatch := batch + DeltaSize(d)
		nextReply := reply + MaxStateSize(d)
		count := uvarintLen(uint64(n + 1))
		if nextBatch+count > maxBytes || nextReply+count > maxBytes {
			break
		}
		batch, reply = nextBatch, nextReply
		n++
	}
	return deltas[:n:n], deltas[n:]
}

func stringSize(s string) int {
	return uvarintLen(uint64(len(s))) + len(s)
}

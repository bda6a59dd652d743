package wire

// Worst-case sizes of the fixed parts, for SplitDeltas: a batch header whose Worker,
// Seq and RulesVersion take their longest varints, and a State whose numbers do.
const (
	maxBatchHeader = 1 + 5 + 10 + 10      // version, worker, seq, rules version (+ node, count)
	maxReplyHeader = 1 + 10 + 10 + 5      // version, rules version, server time, nodes (+ count)
	maxStateFixed  = 1 + 1 + 10 + 5*5 + 1 // window, flags, remaining, 5 × u32, penalty level
)

// EncodedBatchSize is the exact number of bytes AppendBatch writes for b (whether or
// not b is within the limits).
func EncodedBatchSize(b *Batch) int {
	n := 1 + stringSize(b.Node) + uvarintLen(uint64(b.Worker)) + uvarintLen(b.Seq) +
		uvarintLen(b.RulesVersion) + uvarintLen(uint64(len(b.Deltas)))
	for i := range b.Deltas {
		n += DeltaSize(&b.Deltas[i])
	}
	return n
}

// DeltaSize is the number of bytes d adds to an encoded Batch.
func DeltaSize(d *Delta) int {
	return stringSize(d.Key) + stringSize(d.Rule) + 2 +
		uvarintLen(uint64(d.Leased)) + uvarintLen(uint64(d.Over)) + uvarintLen(uint64(d.Returned)) +
		uvarintLen(uint64(d.Rejected)) + uvarintLen(uint64(d.Early)) + 1 +
		uvarintLen(uint64(d.Limit)) + uvarintLen(uint64(d.WindowMs)) + uvarintLen(uint64(d.Burst))
}

// EncodedReplySize is the exact number of bytes AppendReply writes for r (whether or not
// r is within the limits).
func EncodedReplySize(r *Reply) int {
	n := 1 + uvarintLen(r.RulesVersion) + varintLen(r.ServerTimeUs) + uvarintLen(uint64(r.Nodes)) +
		uvarintLen(uint64(len(r.States)))
	for i := range r.States {
		n += StateSize(&r.States[i])
	}
	return n
}

// StateSize is the number of bytes s adds to an encoded Reply.
func StateSize(s *State) int {
	return stringSize(s.Key) + stringSize(s.Rule) + 2 + varintLen(s.Remaining) +
		uvarintLen(uint64(s.Lease)) + uvarintLen(uint64(s.LeaseHeld)) + uvarintLen(uint64(s.ResetInMs)) +
		uvarintLen(uint64(s.RetryInMs)) + uvarintLen(uint64(s.PenaltyInMs)) + 1
}

// SplitDeltas splits deltas so that head fits in one Batch sent by node: at most
// maxDeltas entries, and both the encoded Batch and the Reply the service sends back
// (one State per Delta, with every number at its longest) at most maxBytes bytes.
// Bounding the reply too matters because a State can encode longer than its Delta, and
// the service cannot split its answer.
//
// maxDeltas and maxBytes <= 0 or above the hard limits mean MaxDeltas and MaxBatchSize.
// The header is sized for the longest Worker, Seq and RulesVersion, so the split holds
// whatever sequence number the batch is given later. head is empty only when deltas is,
// or when the first delta alone cannot fit in maxBytes (never the case with the default
// maxBytes for deltas within MaxStringLen).
func SplitDeltas(node string, deltas []Delta, maxDeltas, maxBytes int) (head, tail []Delta) {
	if maxDeltas <= 0 || maxDeltas > MaxDeltas {
		maxDeltas = MaxDeltas
	}
	if maxBytes <= 0 || maxBytes > MaxBatchSize {
		maxBytes = MaxBatchSize
	}
	batch := maxBatchHeader + stringSize(node)
	reply := maxReplyHeader
	n := 0
	for n < len(deltas) && n < maxDeltas {
		d := &deltas[n]
		nextBatch := batch + DeltaSize(d)
		nextReply := reply + stringSize(d.Key) + stringSize(d.Rule) + maxStateFixed
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

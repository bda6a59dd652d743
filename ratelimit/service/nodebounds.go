package service

import (
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// This file bounds what one gateway's batch can do to keys other gateways serve, beyond
// what the lease script bounds itself (RATIONALE.md §3, "What one gateway can do"). A
// node credential proves which gateway sends a batch, not that what it reports
// happened.

// Refusal counts (Delta.Rejected) feed the per-rule refused counters, the hot-key lists
// and the bucket's demand. No gateway refuses more than maxRejectedPerMs requests of one
// bucket per millisecond of the period its delta reports (ElapsedMs, taken between
// minRejectedPeriodMs and maxRejectedPeriodMs: a forged period loosens the bound only
// up to a minute), and no batch reports more than maxRejectedPerBatch in all, plus one
// per delta (a delta that reported refusals keeps one, so it stays a report): a batch
// moves a rule's refused counter by at most 2^22 + its deltas, where a forged count of
// 2^32 per delta moved it by 2.1e10.
const (
	maxRejectedPerMs    = 100 // 100,000 refusals a second, per bucket and gateway
	minRejectedPeriodMs = 100 // one sync interval
	maxRejectedPeriodMs = 60_000
	maxRejectedPerBatch = 1 << 22
)

// boundRejected clamps the refusal counts of b's deltas (see maxRejectedPerMs) and
// returns how many it dropped.
func boundRejected(b *wire.Batch) (dropped int64) {
	left := int64(maxRejectedPerBatch)
	for i := range b.Deltas {
		d := &b.Deltas[i]
		if d.Rejected == 0 {
			continue
		}
		period := min(max(int64(d.ElapsedMs), minRejectedPeriodMs), maxRejectedPeriodMs)
		bound := max(min(maxRejectedPerMs*period, left), 1)
		if n := int64(d.Rejected); n > bound {
			dropped += n - bound
			d.Rejected = uint32(bound)
		}
		left = max(left-int64(d.Rejected), 0)
	}
	return dropped
}

// isRead reports a delta that reports nothing and asks for nothing: no consumption,
// refusal, early retry, returned or held lease, no rate lease held or used out of
// (FlagRate: a rate lease is reported once per lease.RateReportUs even when it admitted
// nothing, and that report renews it), no acquire. Its only effect would be the
// reply: the bucket's remaining, reset, retry and penalty, for any key a gateway names.
// A gateway never sends one to /v1/sync (a bucket is reported only with something
// pending or a lease to renew, lease.Record.Due); to /v1/check it is a strict check of
// cost 0, which is admitted whatever the bucket holds.
func isRead(d *wire.Delta) bool {
	return d.Leased == 0 && d.Over == 0 && d.Returned == 0 && d.Held == 0 && d.Rejected == 0 &&
		d.Early == 0 && d.Flags&wire.FlagAcquire == 0 &&
		(d.Flags&wire.FlagRate == 0 || (d.Rate == 0 && d.RateUsed == 0))
}

// readRefusal is the reason a read delta on /v1/sync is refused with.
// (within wire.MaxTagLen: the store truncates reasons).
const readRefusal = "read: the delta reports nothing"

// admitReads answers the read deltas of a /v1/check batch, which Apply refused
// (readRefusal; a delta of an unknown rule stays refused), as admitted: a strict check of cost 0 is admitted whatever the bucket
// holds, and is answered with none of the bucket's numbers.
func admitReads(b *wire.Batch, states []wire.State) {
	for i := range b.Deltas {
		if d := &b.Deltas[i]; states[i].Reason == readRefusal {
			states[i] = wire.State{Key: d.Key, Rule: d.Rule, Window: d.Window, Flags: wire.StateAllowed}
		}
	}
}

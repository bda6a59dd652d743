package lease

import (
	"testing"

	"github.com/tollgate-rl/tollgate/shared/wire"
)

// An acquire carries the record's consumption since its last report and its lease, and
// the answer's lease part is applied as a batch reply's; an unanswered acquire gives
// the consumption back for the next batch.
func TestAcquireCarriesConsumption(t *testing.T) {
	const now = int64(1_000_000_000)
	synced := Record{SyncedUs: now - 50_000, LeaseLeft: 3, LeaseEpoch: 7, LeaseUntilUs: now + 5_000_000,
		Pending: Pending{Leased: 4, Returned: 1, Rejected: 2}}
	carried := wire.Delta{Leased: 4, Returned: 1, Held: 3, Epoch: 7}
	cases := []struct {
		name    string
		rec     Record
		cut     bool
		reply   wire.State
		answer  bool // false: the acquire got no answer (UncutAcquire)
		lease   int64
		pending Pending
		sent    wire.Delta // the lease part of the acquire, when cut
	}{
		{name: "renewed and granted", rec: synced, cut: true, answer: true,
			reply: wire.State{Flags: wire.StateAllowed, Held: 3, Lease: 5, Epoch: 8, ValidMs: 10_000},
			lease: 8, pending: Pending{Rejected: 2}, sent: carried},
		{name: "lease no longer reserved", rec: synced, cut: true, answer: true,
			reply: wire.State{Held: 0, Lease: 0, Epoch: 8},
			lease: 0, pending: Pending{Rejected: 2}, sent: carried},
		{name: "no answer", rec: synced, cut: true, answer: false,
			lease: 3, pending: synced.Pending, sent: carried},
		{name: "lease ended", rec: func() Record { r := synced; r.LeaseUntilUs = now - 1; return r }(), cut: true, answer: true,
			reply: wire.State{Flags: wire.StateAllowed, Lease: 5, Epoch: 8, ValidMs: 10_000},
			lease: 5, pending: Pending{Rejected: 2}, sent: wire.Delta{Leased: 4, Returned: 4, Epoch: 7}},
		{name: "batch in flight", rec: func() Record { r := synced; r.CutSeq = 99; return r }(), cut: false, answer: true,
			reply: wire.State{Flags: wire.StateAllowed, Lease: 2, Epoch: 8, ValidMs: 10_000},
			lease: 5, pending: synced.Pending},
		{name: "never synced", rec: Record{Pending: Pending{Leased: 1}}, cut: false, answer: true,
			reply: wire.State{Flags: wire.StateAllowed, Lease: 2, Epoch: 8, ValidMs: 10_000},
			lease: 2, pending: Pending{Leased: 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := wire.Delta{Flags: wire.FlagAcquire, Over: 1}
			r, cut := CutAcquire(c.rec, now, 42, &d)
			if cut != c.cut {
				t.Fatalf("cut %v, want %v", cut, c.cut)
			}
			if cut && (d.Leased != c.sent.Leased || d.Returned != c.sent.Returned || d.Held != c.sent.Held || d.Epoch != c.sent.Epoch || d.Over != 1) {
				t.Fatalf("delta %+v: want %+v and over 1", d, c.sent)
			}
			if cut && (r.Pending.Leased != 0 || r.Pending.Returned != 0 || r.CutSeq != 42) {
				t.Fatalf("record after the cut: %+v", r)
			}
			if c.answer {
				r = ApplyAcquireCut(r, &c.reply, &d, 42, now+1000)
			} else {
				r = UncutAcquire(r, &d, 42)
			}
			if r.LeaseLeft != c.lease || r.Pending != c.pending || (cut && r.CutSeq != 0) {
				t.Fatalf("record %+v: want lease %d, pending %+v, no cut", r, c.lease, c.pending)
			}
		})
	}
}

package service

import (
	"math"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// The tests in this file hold ONE gateway's node token (a compromised sidecar) and
// forge what that gateway reports about keys another, honest gateway serves: what one
// node can do to the others is bounded (RATIONALE.md §3, "What one gateway can do").

// twoNodes is a service with a Redis of its own (the fleet set and the rule set are
// global to a Redis), node tokens only, gateways counted in the fleet at once, and an
// attacker's and an honest gateway's credentials. Both have synced until the service
// counts a fleet of two.
type twoNodes struct {
	in                  *instance
	atk, honest         string // node ids
	atkCred, honestCred string
	seq                 atomic.Uint64
}

func startTwoNodes(t *testing.T, rules string) *twoNodes {
	t.Helper()
	const master = "node-bounds-master"
	srv := redistest.StartStandalone(t)
	in := start(t, opts{addrs: srv.Addrs(),
		store: func(c *store.Config) { c.FleetProbation = -1 },
		svc:   func(c *Config) { c.SyncSecret, c.NodeTokensOnly = master, true }})
	pushRules(t, in, rules)
	n := &twoNodes{in: in, atk: "gw-atk", honest: "gw-honest"}
	n.atkCred, n.honestCred = issue(t, master, n.atk), issue(t, master, n.honest)
	n.seq.Store(uint64(time.Now().UnixMicro()))
	eventually(t, 10*time.Second, "a fleet of two counted", func() bool {
		time.Sleep(50 * time.Millisecond)
		n.post(t, true)
		return n.post(t, false).Nodes >= 2
	})
	return n
}

// post sends one batch as the attacker (atk) or the honest gateway and requires 200.
func (n *twoNodes) post(t *testing.T, atk bool, deltas ...wire.Delta) *wire.Reply {
	t.Helper()
	node, cred := n.honest, n.honestCred
	if atk {
		node, cred = n.atk, n.atkCred
	}
	code, r, out := n.in.postAs(t, cred, &wire.Batch{Node: node, Seq: n.seq.Add(1), Deltas: deltas})
	if code != http.StatusOK {
		t.Fatalf("%s's batch: %d %s", node, code, out)
	}
	return r
}

// TestAttackPenaltyLockout: forged consumption drains a victim's bucket and a forged
// early retry once a second claims the victim ignores its Retry-After — before, that
// climbed the victim to level 7 and an honest gateway refused it for 60 s after the
// attack stopped. One node's claims alone leave the key unpenalized in the honest
// gateway's answers (the attacker's own answers carry its own cooldown); with the honest
// gateway's own genuine early claims besides, the level is at most 1 (one base
// cooldown). Once the attack stops and the bucket refills (1 s), the victim is admitted
// through the honest gateway.
func TestAttackPenaltyLockout(t *testing.T) {
	n := startTwoNodes(t, `{"rules":[{"id":"pen","algorithm":"token_bucket","limit":10,"window":"1s"}]}`)
	var clock atomic.Int64
	clock.Store(time.Now().UnixMicro())
	n.in.st.SetTestClock(clock.Load)
	base := n.in.st.Config().Lease.PenaltyBaseUs
	for _, tc := range []struct {
		name         string
		honestClaims bool // the honest gateway reports its own early retries of the victim
		maxLevel     uint8
	}{
		{"attacker alone", false, 0},
		{"attacker and the honest gateway's genuine claims", true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := uniq("victim")
			var level, own uint8
			for i := 0; i < 12; i++ {
				clock.Add(base + base/10)
				d := delta(key, "pen", algo.TokenBucket, 10, 1000)
				d.Over, d.Rejected, d.Early, d.ElapsedMs = 10, 1, 1, 1100 // drain, then claim an early retry
				own = max(own, n.post(t, true, d).States[0].PenaltyLevel)
				// The honest gateway refuses the victim meanwhile (the bucket is spent) and
				// reports it, with early retries of its own or without.
				h := delta(key, "pen", algo.TokenBucket, 10, 1000)
				h.Rejected, h.ElapsedMs = 1, 1100
				if tc.honestClaims {
					h.Early = 1
				}
				level = max(level, n.post(t, false, h).States[0].PenaltyLevel)
			}
			if level > tc.maxLevel {
				t.Fatalf("the honest gateway saw the victim's penalty level reach %d, want at most %d", level, tc.maxLevel)
			}
			if own < 3 {
				t.Fatalf("the attacker's own answers carried level %d: its claims step its own cooldown", own)
			}
			// The attack stops; a window and a base cooldown later the victim, through
			// the honest gateway, acquires a permit.
			clock.Add(1_000_000 + base*int64(tc.maxLevel) + base/10)
			a := delta(key, "pen", algo.TokenBucket, 10, 1000)
			a.Flags, a.Over, a.Want, a.ElapsedMs = wire.FlagAcquire|wire.FlagWant, 1, 1, 1000
			st := n.post(t, false, a).States[0]
			if !st.Allowed() || st.PenaltyInMs != 0 {
				t.Fatalf("victim after the attack: %+v, want admitted, no cooldown", st)
			}
		})
	}
}

// TestAttackForgedRejected: a forged refusal count moves a rule's refused counter by at
// most 2^22 a batch, plus one a delta (before: 2.1e10 from one batch of five deltas of 2^32-1); an honest
// count is counted exactly.
func TestAttackForgedRejected(t *testing.T) {
	n := startTwoNodes(t, `{"rules":[{"id":"rej","limit":100,"window":"1h"}]}`)
	refused := func() float64 {
		return metricValue(t, n.in, `tollgate_rule_refused_requests_total{rule="rej"}`)
	}
	for _, tc := range []struct {
		name              string
		atk               bool
		deltas            int
		rejected, elapsed uint32
		want, wantClamped float64
	}{
		{"honest: 50 refused over a sync interval", false, 1, 50, 100, 50, 0},
		{"honest: a bucket refused 10,000 times in 100 ms", false, 1, 10_000, 100, 10_000, 0},
		{"forged: 2^32-1 over the shortest period", true, 1, math.MaxUint32, 0, 10_000, math.MaxUint32 - 10_000},
		{"forged: five deltas of 2^32-1 over 49 days", true, 5, math.MaxUint32, math.MaxUint32, 1<<22 + 4, 5*math.MaxUint32 - (1<<22 + 4)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, clampedBefore := refused(), metricValue(t, n.in, "tollgate_rejected_clamped_total")
			var ds []wire.Delta
			for i := 0; i < tc.deltas; i++ {
				d := delta(uniq("rej"), "rej", algo.TokenBucket, 100, 3_600_000)
				d.Rejected, d.ElapsedMs = tc.rejected, tc.elapsed
				ds = append(ds, d)
			}
			for _, st := range n.post(t, tc.atk, ds...).States {
				if st.Flags&wire.StateRefused != 0 {
					t.Fatalf("delta refused: %+v", st)
				}
			}
			if got := refused() - before; got != tc.want {
				t.Errorf("refused counter moved by %.0f, want %.0f", got, tc.want)
			}
			if got := metricValue(t, n.in, "tollgate_rejected_clamped_total") - clampedBefore; got != tc.wantClamped {
				t.Errorf("clamped counter moved by %.0f, want %.0f", got, tc.wantClamped)
			}
		})
	}
}

// TestAttackReads: a delta that reports nothing is not answered with the bucket's
// numbers: on /v1/sync it is refused, naming why; on /v1/check (a strict check of cost
// 0) it is admitted, as cost 0 always is, with none of them. A delta that reports
// something is answered as before.
func TestAttackReads(t *testing.T) {
	n := startTwoNodes(t, `{"rules":[{"id":"rd","limit":100,"window":"1h"}]}`)
	key := uniq("read")
	c := delta(key, "rd", algo.TokenBucket, 100, 3_600_000)
	c.Over, c.ElapsedMs = 30, 1000
	if st := n.post(t, false, c).States[0]; st.Remaining+int64(st.Lease) != 70 {
		t.Fatalf("honest consumption: %+v, want 70 left", st)
	}
	read := delta(key, "rd", algo.TokenBucket, 100, 3_600_000)
	refusal := delta(key, "rd", algo.TokenBucket, 100, 3_600_000)
	refusal.Rejected = 1
	// A gateway holding a rate lease reports it once per lease.RateReportUs whatever it
	// did (lease.Record.Due): the rate it holds, and what it admitted out of it, is a
	// report that renews the lease, not a read. Without FlagRate the script ignores
	// those fields, and the delta reports nothing.
	rateHeld := delta(key, "rd", algo.TokenBucket, 100, 3_600_000)
	rateHeld.Flags |= wire.FlagRate
	rateHeld.Rate, rateHeld.RateEpoch = 5000, 1
	rateUsed := delta(key, "rd", algo.TokenBucket, 100, 3_600_000)
	rateUsed.Flags |= wire.FlagRate
	rateUsed.RateUsed = 1
	rateNoFlag := rateHeld
	rateNoFlag.Flags &^= wire.FlagRate
	for _, tc := range []struct {
		name          string
		path          string
		d             wire.Delta
		wantFlags     uint8
		wantRemaining int64 // -1: the bucket's (above 0, at most 70: the honest lease counts as taken)
	}{
		{"sync: a read", "/v1/sync", read, wire.StateRefused, 0},
		{"check: a read (cost 0)", "/v1/check", read, wire.StateAllowed, 0},
		{"sync: a refusal report is answered", "/v1/sync", refusal, wire.StateAllowed, -1},
		{"sync: a rate lease report is answered", "/v1/sync", rateHeld, wire.StateAllowed, -1},
		{"sync: a rate lease's consumption is answered", "/v1/sync", rateUsed, wire.StateAllowed, -1},
		{"sync: rate fields without the rate flag are a read", "/v1/sync", rateNoFlag, wire.StateRefused, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, out := n.in.do(t, http.MethodPost, tc.path, n.atkCred,
				encode(&wire.Batch{Node: n.atk, Seq: n.seq.Add(1), Deltas: []wire.Delta{tc.d}}))
			if code != http.StatusOK {
				t.Fatalf("%d %s", code, out)
			}
			var r wire.Reply
			if err := wire.DecodeReply(out, &r); err != nil {
				t.Fatal(err)
			}
			st := r.States[0]
			if st.Flags&(wire.StateRefused|wire.StateAllowed) != tc.wantFlags {
				t.Fatalf("flags %b, want %b: %+v", st.Flags, tc.wantFlags, st)
			}
			if tc.wantRemaining >= 0 {
				if st.Remaining != tc.wantRemaining || st.ResetInMs != 0 || st.RetryInMs != 0 || st.Lease != 0 {
					t.Fatalf("a read answered with the bucket's numbers: %+v", st)
				}
				if tc.wantFlags == wire.StateRefused && !strings.Contains(st.Reason, "read") {
					t.Fatalf("refused without naming the read: %q", st.Reason)
				}
			} else if st.Remaining <= 0 || st.Remaining+int64(st.Lease) > 70 {
				t.Fatalf("a report: %+v, want the bucket's remaining (0, 70]", st)
			}
		})
	}
	if got := n.in.available(t, key); got != 70 {
		t.Fatalf("available %d after the reads, want 70 (nothing charged)", got)
	}
}

// TestAttackForgedDemand: forged demand — refusal counts that claim a huge rate, a lease
// never reported as held, acquires that say 2^32-1 requests wait — reserves at most one
// gateway's share of a bucket (ceil(capacity/max_share): 25 of 100 at the tests'
// max_share 4; before, a forger took a victim's remaining from 100 to 4 with 96
// outstanding). The victim, through the honest gateway, is then admitted exactly the
// rest (75 strict checks of one permit, the 76th refused) and charged exactly. Beyond
// its share a gateway holds no more than its reports were charged (lease.NodeCap, so a
// gateway that carries a key's traffic holds what it uses): a forger that reported 40
// permits consumed holds at most the 41 it was charged, acquire included.
func TestAttackForgedDemand(t *testing.T) {
	n := startTwoNodes(t, `{"rules":[{"id":"dem","algorithm":"token_bucket","limit":100,"window":"1h"}]}`)
	const share = 25 // ceil(100/4)
	forgedReport := func(key string) wire.Delta {
		d := delta(key, "dem", algo.TokenBucket, 100, 3_600_000)
		d.Rejected, d.ElapsedMs = 10_000, 100 // 100,000 refusals a second claimed; no lease reported held
		return d
	}
	forgedAcquire := func(key string) wire.Delta {
		d := delta(key, "dem", algo.TokenBucket, 100, 3_600_000)
		d.Flags, d.Over, d.Want, d.ElapsedMs = wire.FlagAcquire|wire.FlagWant, 1, math.MaxUint32, 100
		return d
	}
	for _, tc := range []struct {
		name     string
		consumed uint32 // consumption reported first (charged)
		path     string
		forge    func(key string) wire.Delta
		attempts int
		charged  int64 // what the forgery was charged (the consumption, an acquire's cost)
	}{
		{"reports of forged demand", 0, "/v1/sync", forgedReport, 20, 0},
		{"acquires wanting 2^32-1", 0, "/v1/check", forgedAcquire, 1, 1},
		{"40 consumed, then acquires wanting 2^32-1", 40, "/v1/check", forgedAcquire, 3, 43},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := uniq("dem")
			if tc.consumed > 0 {
				d := delta(key, "dem", algo.TokenBucket, 100, 3_600_000)
				d.Over, d.ElapsedMs = tc.consumed, 1000 // admitted out of no lease: charged
				n.post(t, true, d)
			}
			bound := max(int64(share), tc.charged) // lease.NodeCap
			var granted int64
			for i := 0; i < tc.attempts; i++ {
				code, _, out := n.in.do(t, http.MethodPost, tc.path, n.atkCred,
					encode(&wire.Batch{Node: n.atk, Seq: n.seq.Add(1), Deltas: []wire.Delta{tc.forge(key)}}))
				if code != http.StatusOK {
					t.Fatalf("forged batch: %d %s", code, out)
				}
				var r wire.Reply
				if err := wire.DecodeReply(out, &r); err != nil {
					t.Fatal(err)
				}
				granted += int64(r.States[0].Lease)
			}
			us := n.in.usageOf(t, key)
			if len(us.Buckets) != 1 {
				t.Fatalf("usage: %d buckets, want 1", len(us.Buckets))
			}
			u := us.Buckets[0]
			if u.Outstanding > bound || granted > bound {
				t.Fatalf("the forger holds %d outstanding (granted %d), want at most %d (its share %d, or what it was charged)", u.Outstanding, granted, bound, share)
			}
			// The victim, through the honest gateway: strict checks of one permit each.
			admitted := 0
			for i := 0; i < 100; i++ {
				c := delta(key, "dem", algo.TokenBucket, 100, 3_600_000)
				c.Flags, c.Over = wire.FlagStrict, 1
				code, _, out := n.in.do(t, http.MethodPost, "/v1/check", n.honestCred,
					encode(&wire.Batch{Node: n.honest, Seq: n.seq.Add(1), Deltas: []wire.Delta{c}}))
				if code != http.StatusOK {
					t.Fatalf("honest check: %d %s", code, out)
				}
				var r wire.Reply
				if err := wire.DecodeReply(out, &r); err != nil {
					t.Fatal(err)
				}
				if !r.States[0].Allowed() {
					break
				}
				admitted++
			}
			want := int(100 - tc.charged - u.Outstanding)
			if admitted != want || want < 100-int(bound)-int(tc.charged) {
				t.Fatalf("the victim was admitted %d, want %d (the limit less the forger's %d outstanding and %d charged)", admitted, want, u.Outstanding, tc.charged)
			}
			if got := n.in.available(t, key); got != 100-tc.charged-int64(admitted) {
				t.Fatalf("available %d, want %d: the victim's admissions charged exactly", got, 100-tc.charged-int64(admitted))
			}
			t.Logf("forger: %d outstanding after %d attempts; victim admitted %d of 100", u.Outstanding, tc.attempts, admitted)
		})
	}
}

// TestAttackForgedHeld: a forged Held with another gateway's epoch renews nothing for the
// forger — a gateway renews no more than it was granted — and the honest gateway's own
// lease is renewed in full at its next report (before, the forger moved it to its own
// name and the honest gateway's renewal found nothing left).
func TestAttackForgedHeld(t *testing.T) {
	n := startTwoNodes(t, `{"rules":[{"id":"held","algorithm":"token_bucket","limit":100,"window":"1h"}]}`)
	var clock atomic.Int64
	clock.Store(time.Now().UnixMicro())
	n.in.st.SetTestClock(clock.Load)
	key := uniq("held")
	d := delta(key, "held", algo.TokenBucket, 100, 3_600_000)
	d.Over, d.ElapsedMs = 5, 100
	got := n.post(t, false, d).States[0]
	if got.Lease == 0 {
		t.Fatalf("the honest gateway got no lease: %+v", got)
	}
	lease, epoch := got.Lease, got.Epoch
	clock.Add(n.in.st.Config().Lease.EpochMs * 1000) // the lease is now the previous epoch's
	for _, tc := range []struct {
		name     string
		atk      bool
		wantHeld uint32
	}{
		{"the forger claims the honest gateway's lease", true, 0},
		{"the honest gateway renews it", false, lease},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := delta(key, "held", algo.TokenBucket, 100, 3_600_000)
			h.Held, h.Epoch, h.ElapsedMs = lease, epoch, 2000
			if st := n.post(t, tc.atk, h).States[0]; st.Held != tc.wantHeld {
				t.Fatalf("renewed %d of the %d held, want %d: %+v", st.Held, lease, tc.wantHeld, st)
			}
		})
	}
}

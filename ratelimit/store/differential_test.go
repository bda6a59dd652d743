package store

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// twin is the Go model of Redis: shared/lease.Sync on in-memory buckets, and the
// idempotency records of the script (per gateway, per call of a batch).
type twin struct {
	buckets map[string]*lease.Bucket
	pens    map[string]*lease.Penalty
	owns    map[string]*lease.Leases // NodeLeaseKey -> one gateway's leases of a bucket
	idem    map[string]idemRec       // node|slot|chunk -> last call
	// crossEpoch counts renewals beyond what the node's own record counted in the
	// epoch its delta named (the rest from its other live epoch).
	crossEpoch int
}

type idemRec struct {
	seq     uint64
	now     int64
	results []lease.SyncResult
}

func newTwin() *twin {
	return &twin{buckets: map[string]*lease.Bucket{}, pens: map[string]*lease.Penalty{}, owns: map[string]*lease.Leases{}, idem: map[string]idemRec{}}
}

// apply runs the batch as the store's script calls do: per call, a replay check, then
// the deltas in batch order.
func (tw *twin) apply(t *testing.T, s *Store, b *wire.Batch, refused []bool, now int64, cfg lease.SyncConfig) []lease.SyncResult {
	t.Helper()
	out := make([]lease.SyncResult, len(b.Deltas))
	ok := make([]bool, len(b.Deltas))
	for i := range ok {
		ok[i] = !refused[i]
	}
	groups, err := s.plan(context.Background(), b, storeKeys(&Options{}, b), ok)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		id := fmt.Sprint(b.Node, "|", g.slot, "|", g.chunk)
		if rec, ok := tw.idem[id]; ok && b.Seq <= rec.seq {
			for j, i := range g.idx {
				r := lease.SyncResult{Replay: true, Allowed: true, NowUs: rec.now}
				if rec.seq == b.Seq {
					o := rec.results[j]
					r.Grant, r.Held, r.Epoch, r.ValidUs, r.LowWater, r.Rate, r.Stock = o.Grant, o.Held, o.Epoch, o.ValidUs, o.LowWater, o.Rate, o.Stock
				}
				r.RateAnswer = b.Deltas[i].Flags&wire.FlagRate != 0
				out[i] = r
			}
			continue
		}
		rec := idemRec{seq: b.Seq, now: now}
		for _, i := range g.idx {
			d := &b.Deltas[i]
			bk := BucketKey(d.Key, d.Rule, d.Tier, d.Window)
			bu := tw.buckets[bk]
			if bu == nil {
				bu = &lease.Bucket{}
				tw.buckets[bk] = bu
			}
			pk := PenaltyKey(d.Key)
			pen := tw.pens[pk]
			if pen == nil {
				pen = &lease.Penalty{}
				tw.pens[pk] = pen
			}
			c := cfg
			c.Claimant = lease.NodeTag(b.Node)
			ok := NodeLeaseKey(d.Key, d.Rule, d.Tier, d.Window, c.Claimant)
			own := tw.owns[ok]
			if own == nil {
				own = &lease.Leases{}
				tw.owns[ok] = own
			}
			var named int64 // the node's own leases in the epoch the delta names
			switch {
			case d.Epoch == 0:
			case d.Epoch == own.Epoch:
				named = own.Cur
			case d.Epoch == own.Epoch-1:
				named = own.Prev
			}
			out[i] = lease.SyncNode(bu, pen, own, d, now, c)
			tw.crossEpoch += b2i(out[i].Held > named)
			rec.results = append(rec.results, out[i])
		}
		tw.idem[id] = rec
	}
	return out
}

// TestDifferential drives the Lua script and the Go twin with the same random batches
// and the same clock and requires identical answers and identical stored bytes after
// every batch, for every algorithm, on a standalone server and on a cluster.
func TestDifferential(t *testing.T) {
	for _, mode := range []Mode{Standalone, Cluster} {
		for k := 0; k < numKinds; k++ {
			kind := algo.Kind(k)
			t.Run(fmt.Sprintf("%s/%s", mode, kind), func(t *testing.T) {
				t.Parallel()
				var clock int64
				// No client retry: a pipeline resent after its scripts ran answers as a
				// replay (the idempotency record), which the twin cannot foresee; under
				// load that read as a divergence. Without retries it fails as an error.
				// The cluster client can also resend a pipeline whose read timed out (as a
				// redirect, whatever MaxRetries says): with the shipped 500 ms read
				// timeout a loaded 2-core machine saw a script answer as a replay (once
				// in about ten runs). Timeouts far beyond any script's time remove that.
				s, _ := newStore(t, mode, func(c *Config) {
					c.MaxRetries = -1
					c.ReadTimeout, c.WriteTimeout = 30*time.Second, 30*time.Second
				})
				s.nowUs = func() int64 { return clock }
				differential(t, s, kind, uint64(k)+11, &clock)
			})
		}
	}
}

type heldLease struct {
	n     int64
	epoch uint32
	// the rate lease the node holds (rate leases: token_bucket and gcra)
	rate      int64
	rateEpoch uint32
}

func differential(t *testing.T, s *Store, kind algo.Kind, seed uint64, clock *int64) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 42))
	// The clock has a stream of its own: the batches' draws depend on the answers (the
	// leases a node holds), and the clock's steps must not move with them.
	crng := rand.New(rand.NewPCG(seed, 43))
	rr := rand.New(rand.NewPCG(seed, 7))  // the rate leases' choices: rng's sequence stays as it was
	cr := rand.New(rand.NewPCG(seed, 44)) // the charged node's choices (r6), likewise
	chargedLast := map[string]bool{}      // node -> its last r6 delta reported consumption
	xr := rand.New(rand.NewPCG(seed, 45)) // which leases an acquire leaves unreported, likewise
	cfg := s.cfg.Lease
	tw := newTwin()
	prefix := fmt.Sprintf("diff-%s-%d-%d", kind, seed, time.Now().UnixNano()) // fresh keys on every run
	keys := []string{prefix + "-a", prefix + "-b", prefix + "-we}ird", prefix + "-{c}"}
	type params struct {
		kind                   algo.Kind
		limit, windowMs, burst uint32
	}
	// Each rule has its own algorithm, so one call mixes algorithms.
	rulesP := map[string]params{
		"r1":  {kind, 20, 1000, 0},
		"r2":  {(kind + 1) % algo.Kind(numKinds), 50, 10_000, 80},
		"r:3": {(kind + 3) % algo.Kind(numKinds), 7, 2000, 3},
		// At the bounds: the largest limit and burst, and windows of half the longest
		// (window 0) and the longest (window 1, twice as long).
		"r4": {kind, uint32(maxLimitOf(kind)), algo.MaxWindowUs / 2000, algo.MaxBurst},
		// A gcra rule whatever kind: the rate leases' buckets (chosen with rr).
		"r5": {algo.GCRA, 30, 1000, 30},
		// A bucket that refills within a second, for what a node's charged reports let it
		// hold (lease.NodeCap; chosen with cr).
		"r6": {algo.TokenBucket, 100, 1000, 0},
	}
	ruleIDs := []string{"r1", "r2", "r:3", "r4"}
	// A calendar rule sends a day (window 0; r:3 a week) or a month (window 1) at its own
	// UTC offset; the clock starts minutes before a UTC day, week, month (or year) boundary,
	// which the UTC rules cross.
	calOffset := map[string]int64{"r1": 0, "r2": 330, "r:3": 0, "r4": -480}
	fill := func(d *wire.Delta, rl string, win uint8) {
		p := rulesP[rl]
		d.Algo, d.Limit, d.WindowMs, d.Burst = uint8(p.kind), p.limit, p.windowMs*uint32(win+1), p.burst
		if p.kind == algo.Calendar {
			per := []algo.Period{algo.Day, algo.Month}[win]
			if rl == "r:3" && win == 0 {
				per = algo.Week
			}
			cp := algo.CalendarParams(int64(p.limit), per, calOffset[rl])
			d.WindowMs, d.Burst = uint32(cp.WindowUs/1000), uint32(cp.Burst)
		}
	}
	tiers := []string{"", "", "pro"}
	nodes := []string{prefix + "-n1", prefix + "-n2", prefix + "-n:3"}
	seqs := map[string]uint64{}
	local := map[string]heldLease{} // node|bucket -> the lease the node believes it holds
	type bucketRef struct {
		key, rule, tier string
		win             uint8
	}
	rateHeld := map[string][]bucketRef{} // node -> buckets it was granted a rate lease on
	var history []wire.Batch
	*clock = 1_700_000_000_000_000 + int64(rng.IntN(1_000_000))
	if kind == algo.Calendar {
		// 2027-03-01 (a Monday after a common February), 2029-01-01 (a Monday, a year
		// end), 2028-03-01 (after a leap February), a minute before
		starts := []int64{1_803_859_200_000_000, 1_861_920_000_000_000, 1_835_481_600_000_000}
		*clock = starts[rng.IntN(len(starts))] - 60_000_000 + int64(rng.IntN(1_000_000))
	}
	startDay := *clock / algo.DayUs
	if kind == algo.Calendar {
		// fewer buckets, so that more of them are reported across a boundary
		keys, tiers = keys[:2], tiers[:1]
	}
	var lastGrants int // calendar: grants in a period's last epoch
	var rateGrants, rateRenewed, forgedRates int
	var replays, grants, reclaims, refusals, penalties, overshoots, clamps, excesses, renewals, acquired, refusedDeltas, stepsBack, fleetPenalties, ownPenalties, atShare, beyondShare int

	for step := 0; step < 240; step++ {
		var b wire.Batch
		// node|bucket -> a lease the batch's delta did not report: the delta is an
		// acquire cut while a batch carries the bucket, and its grant joins the lease,
		// which then carries the grant's epoch (lease.ApplyReply), as at a gateway
		kept := map[string]heldLease{}
		if len(history) > 0 && rng.IntN(8) == 0 {
			b = history[rng.IntN(len(history))] // a retried (or late duplicate) batch
		} else {
			b.Node = nodes[rng.IntN(len(nodes))]
			seqs[b.Node] += uint64(1 + rng.IntN(3))
			b.Seq = seqs[b.Node]
			used := map[string]bool{}
			for n := 1 + rng.IntN(4); n > 0; n-- {
				key, rl, tier := keys[rng.IntN(len(keys))], ruleIDs[rng.IntN(len(ruleIDs))], tiers[rng.IntN(len(tiers))]
				win := uint8(rng.IntN(2))
				revisit := false
				if rb := rateHeld[b.Node]; len(rb) > 0 && rr.IntN(2) == 0 {
					// the node reports a bucket whose rate lease it holds (a renewal)
					x := rb[rr.IntN(len(rb))]
					key, rl, tier, win, revisit = x.key, x.rule, x.tier, x.win, true
				} else if rr.IntN(3) == 0 {
					// its own caller keys: another rule's early refusals would penalize
					// the key, and a penalized key gets no lease
					rl, key = "r5", prefix+"-rate-"+strconv.Itoa(rr.IntN(2))
				}
				bk := BucketKey(key, rl, tier, win)
				if used[bk] && rng.IntN(4) != 0 {
					continue // now and then a duplicate, which is refused
				}
				used[bk] = true
				p := rulesP[rl]
				d := wire.Delta{Key: key, Rule: rl, Tier: tier, Window: win, ElapsedMs: uint32(rng.IntN(3000))}
				fill(&d, rl, win)
				lk := b.Node + "|" + bk
				if l := local[lk]; l.rate > 0 || rr.IntN(3) == 0 {
					// A gateway that takes rate leases reports the rate it held (now and
					// then of an older epoch, or none) and what it admitted out of it.
					d.Flags |= wire.FlagRate
					d.Rate, d.RateEpoch = uint32(l.rate), l.rateEpoch
					if rr.IntN(10) == 0 {
						d.RateEpoch--
					}
					if l.rate == 0 && rr.IntN(3) == 0 {
						// A rate the node does not hold: another node's, as a forged report
						// would name it. The node's own record releases none of it.
						for _, o := range nodes {
							if ol := local[o+"|"+bk]; o != b.Node && ol.rate > 0 {
								d.Rate, d.RateEpoch = uint32(ol.rate), ol.rateEpoch
								forgedRates++
								break
							}
						}
					}
					d.RateUsed = uint32(rr.IntN(int(p.limit) + 1))
				}
				if l := local[lk]; l.n > 0 {
					l0 := l
					d.Epoch = l.epoch
					if rng.IntN(10) == 0 {
						d.Epoch-- // a lease of an older epoch
					}
					used := rng.Int64N(l.n + 1)
					d.Leased = uint32(used)
					l.n -= used
					if rng.IntN(6) == 0 || (revisit && rr.IntN(2) == 0) {
						d.Returned = uint32(l.n)
						l.n = 0
					}
					d.Held = uint32(l.n)
					local[lk] = heldLease{}
					if xr.IntN(5) == 0 {
						// (rng drew as for a report, so its sequence stays as it was)
						local[lk], kept[lk] = l0, l0
						d.Epoch, d.Leased, d.Returned, d.Held = 0, 0, 0, 0
						d.Flags |= wire.FlagAcquire
					} else if xr.IntN(3) == 0 {
						// reported under the next epoch: a reply of that epoch renewed part
						// of what the record holds (the rest is of the epoch before)
						d.Epoch = l.epoch + 1
					}
				}
				if rng.IntN(2) == 0 {
					d.Over = uint32(rng.IntN(int(p.limit)/2 + 1))
				}
				d.Rejected = uint32(rng.IntN(4))
				if rng.IntN(4) == 0 {
					d.Early = 1
					d.Over = p.limit // refusals come when the bucket is spent
				}
				if rng.IntN(30) == 0 {
					d.Over = uint32(rng.IntN(5 * int(p.limit))) // more than one window of debt
				}
				switch rng.IntN(12) {
				case 0:
					d.Flags |= wire.FlagStrict
				case 1, 2:
					d.Flags |= wire.FlagAcquire
					if rng.IntN(2) == 0 {
						d.Flags |= wire.FlagWant // requests waiting for the acquire
						d.Want = uint32(rng.IntN(int(p.limit) + 1))
					}
				}
				if rng.IntN(8) == 0 {
					d.Flags |= wire.FlagDegraded
				}
				if rng.IntN(40) == 0 {
					d.Limit = 0 // refused: params out of range
				}
				if rl == "r5" && rr.IntN(4) != 0 {
					// Mostly a key held at its limit, as rate leases see it: a second's
					// report of what the leases admitted and the demand refused, nothing
					// beyond a lease, no early refusal (no penalty).
					d.Flags &^= wire.FlagStrict | wire.FlagAcquire | wire.FlagWant | wire.FlagDegraded
					d.Want, d.Over, d.Early, d.ElapsedMs = 0, 0, 0, uint32(900+rr.IntN(200))
					d.Rejected = uint32(2*int(p.limit) + rr.IntN(int(p.limit))) // beyond its limit
				}
				b.Deltas = append(b.Deltas, d)
			}
			if cr.IntN(3) == 0 {
				// A node that carries a key's traffic: it reports consumption admitted out
				// of no lease (charged), then acquires wanting the whole bucket, which it
				// may hold up to what it was charged (lease.NodeCap), beyond a lease's share.
				d := wire.Delta{Key: prefix + "-charged", Rule: "r6", ElapsedMs: 1000}
				fill(&d, "r6", 0)
				if !chargedLast[b.Node] {
					d.Over = uint32(60 + cr.IntN(40))
				} else {
					d.Flags, d.Over, d.Want = wire.FlagAcquire|wire.FlagWant, 1, 100
				}
				chargedLast[b.Node] = !chargedLast[b.Node]
				b.Deltas = append(b.Deltas, d)
			}
			if step%40 == 39 {
				// A large batch: several script calls per node (maxPerCall).
				for i := 0; i < 3*maxPerCall; i++ {
					d := wire.Delta{Key: fmt.Sprint(prefix, "-bulk-", step, "-", i), Rule: "r1", Over: uint32(i % 25)}
					fill(&d, "r1", 0)
					b.Deltas = append(b.Deltas, d)
				}
			}
			history = append(history, b)
		}
		switch {
		case kind == algo.Calendar && step%20 == 10:
			// a few seconds before the next UTC midnight: the day rules cross it
			*clock = (*clock/algo.DayUs+1)*algo.DayUs - 4_000_000 + int64(crng.IntN(1_000_000))
		case crng.IntN(20) == 0:
			*clock += 2*cfg.EpochMs*1000 + int64(crng.IntN(2_000_000)) // a silence: epochs end
		case crng.IntN(19) == 0:
			// The server clock steps back (a corrected clock, a promoted replica): leases
			// stored in an epoch ahead of now.
			back := *clock - int64(crng.IntN(int(cfg.EpochMs*1000)))
			stepsBack += b2i(back/(cfg.EpochMs*1000) != *clock/(cfg.EpochMs*1000))
			*clock = back
		default:
			*clock += int64(crng.IntN(600_000))
		}
		now := *clock
		fleetSize := uint32(rng.IntN(5)) // 0 and 1: no fleet; first leases capped beyond
		s.nodes = func() uint32 { return fleetSize }
		cfg.Nodes = int64(fleetSize)
		out, err := s.Apply(ctx, &b, Options{Idempotent: true})
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		refused := make([]bool, len(b.Deltas))
		for i := range refused {
			refused[i] = out.States[i].Flags&wire.StateRefused != 0
		}
		want := tw.apply(t, s, &b, refused, now, cfg)
		for i := range b.Deltas {
			if why := lease.Refusal(&b.Deltas[i]); why != "" || out.States[i].Flags&wire.StateRefused != 0 {
				if out.States[i].Flags&wire.StateRefused == 0 || out.Results[i] != (lease.SyncResult{}) {
					t.Fatalf("step %d delta %d: refusal %q, state %+v", step, i, why, out.States[i])
				}
				refusedDeltas++
				continue
			}
			if out.Results[i] != want[i] {
				t.Fatalf("step %d delta %d (%+v):\nlua %+v\ngo  %+v", step, i, b.Deltas[i], out.Results[i], want[i])
			}
			r := &want[i]
			d := &b.Deltas[i]
			if dp := lease.ParamsOf(d); dp.Kind == algo.Calendar && !r.Replay {
				_, _, pe := algo.CalendarWindow(dp, now)
				lastGrants += b2i(r.Grant > 0 && pe-now < cfg.EpochMs*1000)
			}
			replays += b2i(r.Replay)
			grants += b2i(!r.Replay && r.Grant > 0)
			reclaims += b2i(r.Reclaimed > 0)
			refusals += b2i(!r.Allowed)
			penalties += b2i(r.Level > 0 && !r.Replay)
			if pen := tw.pens[PenaltyKey(d.Key)]; pen != nil && !r.Replay && fleetSize > 1 {
				fleetPenalties += b2i(pen.Level > 0) // the key's, corroborated by two nodes
				ownPenalties += b2i(pen.Owner != "") // one node's own cooldown
			}
			if own := tw.owns[NodeLeaseKey(d.Key, d.Rule, d.Tier, d.Window, lease.NodeTag(b.Node))]; own != nil && fleetSize > 1 {
				capa := lease.ParamsOf(d).Capacity()
				atShare += b2i(!r.Replay && own.Outstanding() >= lease.NodeCap(capa, own, cfg)) // grants cut to what the node may hold
				// beyond a lease's share: what its reports were charged let it hold more
				beyondShare += b2i(!r.Replay && own.Outstanding() > (capa+cfg.MaxShare-1)/cfg.MaxShare)
			}
			overshoots += b2i(r.Overshoot > 0)
			clamps += b2i(r.Clamped > 0)
			excesses += b2i(r.Excess > 0)
			renewals += b2i(!r.Replay && r.Held > 0)
			acquired += b2i(!r.Replay && d.Flags&wire.FlagAcquire != 0 && r.Allowed && r.Grant > 0)
			rateGrants += b2i(!r.Replay && r.Rate > 0)
			rateRenewed += b2i(!r.Replay && d.Rate > 0) // released, and granted anew or not
			if lk := b.Node + "|" + BucketKey(d.Key, d.Rule, d.Tier, d.Window); !r.Replay && kept[lk].n > 0 {
				if r.Grant > 0 {
					local[lk] = heldLease{kept[lk].n + r.Grant, r.Epoch, kept[lk].rate, kept[lk].rateEpoch}
				}
			} else if !r.Replay {
				local[b.Node+"|"+BucketKey(d.Key, d.Rule, d.Tier, d.Window)] = heldLease{r.Held + r.Grant, r.Epoch, r.Rate, r.Epoch}
				if r.Rate > 0 {
					rateHeld[b.Node] = append(rateHeld[b.Node], bucketRef{d.Key, d.Rule, d.Tier, d.Window})
				}
			}
		}
		compareStored(t, s, tw, &b, step)
	}
	if kind == algo.Calendar {
		if *clock/algo.DayUs == startDay {
			t.Errorf("the clock never crossed the UTC boundary it started before")
		}
		if lastGrants == 0 {
			t.Errorf("calendar: no grant in a period's last epoch")
		}
	}
	// The sequence must have exercised every branch worth comparing. (Rate leases are
	// asked for, but the service grants none: lease.SyncConfig.RateLeases; rateGrants and
	// rateRenewed count what the comparison covered of them, forgedRates the reports of
	// another node's rate, which exist only once a rate was granted.)
	_, _, _ = rateGrants, rateRenewed, forgedRates
	for name, n := range map[string]int{"replays": replays, "grants": grants, "reclaims": reclaims, "strict refusals": refusals,
		"penalties": penalties, "penalties in a fleet": fleetPenalties, "a node's own cooldowns": ownPenalties, "node leases at their cap": atShare, "node leases beyond a share, charged for": beyondShare, "overshoots": overshoots, "clamped debts": clamps, "excess reports": excesses, "renewals": renewals, "acquires with a lease": acquired, "refused deltas": refusedDeltas,
		"clock steps back across an epoch": stepsBack, "renewals across a node's two epochs": tw.crossEpoch} {
		if n == 0 {
			t.Errorf("no %s in the random sequence: the comparison did not cover them", name)
		}
	}
}

// maxLimitOf is the largest limit algo.Params.Validate accepts for kind k.
func maxLimitOf(k algo.Kind) int64 {
	if k == algo.SlidingWindowLog {
		return algo.MaxLogLimit
	}
	return algo.MaxLimit
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// compareStored checks every key the batch touched against the twin.
func compareStored(t *testing.T, s *Store, tw *twin, b *wire.Batch, step int) {
	t.Helper()
	ctx := context.Background()
	for i := range b.Deltas {
		d := &b.Deltas[i]
		bk := BucketKey(d.Key, d.Rule, d.Tier, d.Window)
		if bu := tw.buckets[bk]; bu != nil {
			got, err := s.rdb.Get(ctx, bk).Bytes()
			if err != nil {
				t.Fatalf("step %d: GET %q: %v", step, bk, err)
			}
			if want := bu.AppendValue(nil); !bytes.Equal(got, want) {
				t.Fatalf("step %d: key %q differs:\nredis %x\ngo    %x", step, bk, got, want)
			}
		}
		ok := NodeLeaseKey(d.Key, d.Rule, d.Tier, d.Window, lease.NodeTag(b.Node))
		if own := tw.owns[ok]; own != nil {
			got, err := s.rdb.Get(ctx, ok).Bytes()
			if err != nil && err != redis.Nil {
				t.Fatalf("step %d: GET %q: %v", step, ok, err)
			}
			if want := (&lease.Bucket{Leases: *own}).AppendValue(nil); !bytes.Equal(got, want) {
				t.Fatalf("step %d: node record %q differs:\nredis %x\ngo    %x", step, ok, got, want)
			}
		}
		pk := PenaltyKey(d.Key)
		got, err := s.rdb.HGetAll(ctx, pk).Result()
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{}
		if p := tw.pens[pk]; p != nil {
			want = p.Fields()
		}
		if !maps.Equal(got, want) {
			t.Fatalf("step %d: key %q differs:\nredis %v\ngo    %v", step, pk, sorted(got), sorted(want))
		}
	}
}

func sorted(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, fmt.Sprintf("%s=%q", k, v))
	}
	sort.Strings(out)
	return out
}

package plugin

import (
	"encoding/binary"
	"strconv"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/rule"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// syncer is one worker's part of the gateway-wide sync (RATIONALE.md §2, §6). Every
// worker queues the buckets its decisions made urgent and reads the shared health; one
// worker, the leader, holds leaderKey and syncs for the whole Envoy: once per tick it cuts
// the due buckets' consumption out of their shared records into one batch (a heartbeat
// when nothing is due), sends it, and folds the reply back into the records. At most one
// batch is in flight; a batch that failed is resent unchanged (same seq) until it is
// acknowledged, so the service applies it exactly once, whichever worker resends it.
type syncer struct {
	p      *Plugin
	worker uint32 // this VM's id in leaderKey

	// state is this worker's copy of syncKey, read at stateAt.
	state   syncState
	stateAt int64

	// urgent holds the slots this worker's decisions made urgent since its last tick.
	urgent []uint32
	// lastTickUs is when tick last ran (the host ticks four times per interval).
	lastTickUs int64

	// leader only:
	term     uint32
	inflight bool
	token    uint32
	sentUs   int64 // when this worker sent the batch in flight (the RTT histogram's start)
	// hedge is a second callout carrying the batch in flight, sent when the first is
	// still unanswered at the next tick (0: none); the first answer of the two counts.
	hedge uint32
	// probeToken is the liveness probe in flight (0: none), sent probeUs (see probe).
	probeToken uint32
	probeUs    int64
	batch      wire.Batch // the batch in flight (or to resend)
	ids        []string   // bucket id of each delta of batch
	carry      []uint32   // urgent slots a full batch left for the next one
	scanNext   uint64     // next slot of the staleness scan

	unhealthy bool // what this worker last added to the breaker_state gauge
	buf       []byte
	// fleetSinceUs is when this worker first saw a fleet size from the service (0: not
	// yet): cold-start allowances trust that size lease.FleetSettleUs later.
	fleetSinceUs int64
}

// Timing of the sync (RATIONALE.md §2; sync.stale_ms bounds how long consumption waits
// unreported, and the staleness scan visits every slot in half of it).
const (
	// renewUs: a lease used since its last report is renewed this long before it ends.
	renewUs = 2_000_000
	// healthRefreshUs: a worker rereads the shared health at most this old on the
	// request path, so every worker sees a change within it.
	healthRefreshUs = 25_000
	// maxUrgent bounds the shared urgent list (slots beyond it wait for the scan).
	maxUrgent = 1 << 16
	// maxScan bounds the slots the staleness scan reads per tick.
	maxScan = 2048
)

func newSyncer(p *Plugin, worker uint32) *syncer {
	return &syncer{p: p, worker: worker}
}

func (s *syncer) cfg() *rule.Sync { return &s.p.cfg.Sync }

func (s *syncer) intervalUs() int64 { return s.cfg().IntervalMs * 1000 }

func (s *syncer) staleUs() int64 { return s.cfg().StaleMs * 1000 }

// refresh rereads syncKey when the copy is older than maxAgeUs.
func (s *syncer) refresh(now, maxAgeUs int64) {
	if s.stateAt != 0 && now-s.stateAt < maxAgeUs {
		return
	}
	s.stateAt = now
	v, _, found, err := s.p.host.SharedGet(syncKey)
	if err != nil || !found {
		return
	}
	var st syncState
	if st.decode(v) == nil {
		s.state = st
	}
	if s.state.Nodes > 0 && s.fleetSinceUs == 0 {
		s.fleetSinceUs = now
	}
	s.gauge(now)
}

// healthy is the shared health as of at most healthRefreshUs ago.
func (s *syncer) healthy(now int64) bool {
	s.refresh(now, healthRefreshUs)
	return s.healthyNow(now)
}

// healthyNow: once the service's last answer is two intervals old, a failed sync or a
// sync still unanswered an interval and a quarter after it was sent makes the gateway
// degraded — a service that stops answering, whether it refuses connections or hangs,
// is noticed within about two intervals (RATIONALE.md §3: 250 ms at the default 100
// ms). The service's answers are the syncs', the acquires' and checks', and those of the
// probes the leader sends while a sync is slow (syncer.probe): a sync that is slow but
// whose service answers is not a reason. A single lost callout is not either: the batch
// is resent on a second callout at the next tick (a hedge), whose answer comes before
// the quarter interval is over. breaker_failures failed or timed-out syncs in a row make
// it degraded too, and so does no answer for ten intervals and the timeout (no worker
// syncs).
func (s *syncer) healthyNow(now int64) bool {
	iv, to := s.intervalUs(), s.cfg().TimeoutMs*1000
	return s.state.healthy(now, 2*iv, iv+iv/4, 10*iv+to, uint32(max(1, s.cfg().BreakerFailures)))
}

// queue asks for bucket slot n to be in the next batch.
func (s *syncer) queue(n uint32) {
	if len(s.urgent) < maxUrgent {
		s.urgent = append(s.urgent, n)
	}
}

// gauge keeps this worker's share of the breaker_state gauge current.
func (s *syncer) gauge(now int64) {
	if s.p.m == nil {
		return
	}
	if open := !s.healthyNow(now); open != s.unhealthy {
		s.unhealthy = open
		delta := int64(1)
		if !open {
			delta = -1
		}
		s.p.m.add(s.p.m.breakerState, delta)
		// One line per change and worker: when the gateway went degraded and came back.
		if open {
			s.p.host.Log(LogWarn, "tollgate: sync breaker open: deciding from the local share (degraded) until the service answers")
		} else {
			s.p.host.Log(LogInfo, "tollgate: sync breaker closed: the service answers again")
		}
	}
}

// tick runs every sync interval on every worker.
func (s *syncer) tick(now int64) {
	s.refresh(now, 0)
	if !s.lead(now) {
		s.publishUrgent()
		return
	}
	s.run(now)
}

// publishUrgent appends this worker's urgent slots to urgentKey for the leader.
func (s *syncer) publishUrgent() {
	if len(s.urgent) == 0 {
		return
	}
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		cur, cas, found, err := s.p.host.SharedGet(urgentKey)
		if err != nil {
			return
		}
		if !found {
			cas = s.p.table.fenceCas()
		}
		if len(cur)/4+len(s.urgent) > maxUrgent {
			s.p.m.add(s.p.m.urgentDropped, int64(len(s.urgent)))
			s.urgent = s.urgent[:0]
			return // the staleness scan finds them
		}
		buf := append(s.buf[:0], cur...)
		for _, n := range s.urgent {
			buf = binary.LittleEndian.AppendUint32(buf, n)
		}
		s.buf = buf
		if ok, err := s.p.host.SharedSet(urgentKey, buf, cas); err != nil || ok {
			s.urgent = s.urgent[:0]
			return
		}
	}
}

// takeUrgent empties urgentKey and returns what it held, with this worker's own.
func (s *syncer) takeUrgent(dst []uint32) []uint32 {
	dst = append(dst, s.urgent...)
	s.urgent = s.urgent[:0]
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		cur, cas, found, err := s.p.host.SharedGet(urgentKey)
		if err != nil || !found || len(cur) < 4 {
			return dst
		}
		if ok, err := s.p.host.SharedSet(urgentKey, nil, cas); err != nil {
			return dst
		} else if ok {
			for i := 0; i+4 <= len(cur); i += 4 {
				dst = append(dst, binary.LittleEndian.Uint32(cur[i:]))
			}
			return dst
		}
	}
	return dst
}

// lead makes this worker the leader if it is, or if the leader stopped beating for
// three intervals, and beats.
func (s *syncer) lead(now int64) bool {
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		v, cas, found, err := s.p.host.SharedGet(leaderKey)
		if err != nil {
			return false
		}
		var l leader
		ok := found && l.decode(v)
		mine := ok && l.Worker == s.worker && l.Term == s.term && s.term != 0
		if !mine && ok && now-l.BeatUs <= 3*s.intervalUs() && now >= l.BeatUs-s.intervalUs() {
			s.term = 0
			return false // someone else leads
		}
		next := leader{Worker: s.worker, Term: l.Term, BeatUs: now}
		if !mine {
			next.Term++
			if next.Term == 0 {
				next.Term = 1
			}
		}
		if !found {
			cas = s.p.table.fenceCas()
		}
		s.buf = next.append(s.buf[:0])
		written, err := s.p.host.SharedSet(leaderKey, s.buf, cas)
		if err != nil {
			return false
		}
		if written {
			if !mine {
				s.takeOver()
			}
			s.term = next.Term
			return true
		}
	}
	return false
}

// takeOver starts leading: a batch the previous leader left unacknowledged is resent
// unchanged; the staleness scan starts over, so every bucket is seen within its bound.
func (s *syncer) takeOver() {
	s.inflight, s.hedge, s.probeToken = false, 0, 0
	s.batch.Deltas = s.batch.Deltas[:0]
	s.ids = s.ids[:0]
	if !s.state.Unacked {
		return
	}
	v, _, found, err := s.p.host.SharedGet(batchKey)
	if err != nil || !found || wire.DecodeBatch(v, &s.batch) != nil {
		s.setState(func(st *syncState) { st.Unacked = false })
		return
	}
	for i := range s.batch.Deltas {
		d := &s.batch.Deltas[i]
		s.ids = append(s.ids, bucketID(&s.buf, d.Key, d.Rule, d.Tier, int(d.Window)))
	}
}

// run is the leader's tick: wait for the batch in flight, resend a failed one, or cut
// and send the next.
func (s *syncer) run(now int64) {
	st := &s.state
	if s.inflight {
		if s.hedge == 0 && now-st.SentUs >= s.intervalUs()/2 {
			s.sendHedge()
		}
		if now-st.SentUs <= s.cfg().TimeoutMs*1000+2*s.intervalUs() {
			return
		}
		s.inflight, s.hedge = false, 0 // the host never answered: count it failed, resend
		s.failed(now, false)
	}
	if st.Failures > 0 && now < st.OpenUntilUs {
		return
	}
	if st.Unacked && len(s.batch.Deltas) > 0 {
		v, _, found, err := s.p.host.SharedGet(batchKey)
		if err == nil && found {
			s.send(now, v)
			return
		}
	}
	s.cut(now)
}

// cut builds the next batch from the due buckets and sends it.
func (s *syncer) cut(now int64) {
	p := s.p
	cfg := s.cfg()
	seq := max(s.state.Seq+1, uint64(now)) // seqs start at the gateway's clock: a restart never reuses one
	s.batch = wire.Batch{Node: p.node, Seq: seq, RulesVersion: p.rulesVersion, Deltas: s.batch.Deltas[:0]}
	s.ids = s.ids[:0]
	size := wire.BatchHeaderSize(p.node, seq, p.rulesVersion, "", int(cfg.MaxBatch))
	replySize := wire.MaxReplyHeader(0, int(cfg.MaxBatch))
	slots := s.takeUrgent(s.carry[:0])
	s.carry = slots[:0]
	full := false
	consider := func(n uint32) {
		// Room for one more delta of the longest kind, and for its reply.
		if full || int64(len(s.batch.Deltas)) >= min(cfg.MaxBatch, wire.MaxDeltas) ||
			size+maxDeltaSize > maxBatchBytes || replySize+maxStateSize > maxBatchBytes {
			full = true
			s.carry = append(s.carry, n)
			return
		}
		d, id, ok := s.cutSlot(now, n, uint32(seq))
		if !ok {
			return
		}
		size += wire.DeltaSize(&d)
		replySize += wire.MaxStateSize(&d)
		s.batch.Deltas = append(s.batch.Deltas, d)
		s.ids = append(s.ids, id)
	}
	for _, n := range slots {
		consider(n)
	}
	// The staleness scan: every slot once per stale_ms/2, at most maxScan slots a tick
	// (a table of 65,536 slots is then seen every 3.2 s at 100 ms ticks, whatever
	// stale_ms says).
	perTick := min(int64(p.table.slots)*2*s.intervalUs()/max(s.staleUs(), 1)+1, maxScan)
	for i := int64(0); i < perTick && !full; i++ {
		consider(uint32(s.scanNext % p.table.slots))
		s.scanNext++
	}
	if len(s.batch.Deltas) == 0 {
		s.batch.Seq = s.state.Seq // a heartbeat: nothing to apply, nothing to resend
	}
	body, err := wire.AppendBatch(p.callBuf[:0], &s.batch)
	if err != nil {
		p.host.Log(LogError, "tollgate: encode batch: "+err.Error())
		s.batch.Deltas = s.batch.Deltas[:0]
		return
	}
	p.callBuf = body
	if len(s.batch.Deltas) > 0 {
		if _, err := p.host.SharedSet(batchKey, body, 0); err != nil {
			p.host.Log(LogWarn, "tollgate: store batch: "+err.Error())
		}
		s.setState(func(st *syncState) { st.Seq, st.Unacked = seq, true })
	}
	s.send(now, body)
}

// cutSlot cuts the consumption of the bucket in slot n into a delta, if it is due.
func (s *syncer) cutSlot(now int64, n uint32, seq uint32) (wire.Delta, string, bool) {
	p := s.p
	t := &p.table
	key := t.slotKey(uint64(n))
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		v, cas, found, err := p.host.SharedGet(key)
		if err != nil || !found {
			return wire.Delta{}, "", false
		}
		id, recBytes, ok := splitSlotID(v)
		if !ok || lease.DecodeRecord(recBytes, &s.p.scratch) != nil {
			return wire.Delta{}, "", false
		}
		rec := &s.p.scratch
		if !rec.Due(now, s.staleUs(), s.cfg().StaleLeasedMs*1000, renewUs, seq) { // not twice in one batch
			return wire.Delta{}, "", false
		}
		ruleID, w, tier, ck, ok := parseBucketID(id)
		if !ok {
			return wire.Delta{}, "", false
		}
		var d wire.Delta
		prm, known := s.params(ruleID, tier, ck, w)
		next := lease.Cut(*rec, prm, now, seq, &d)
		t.valBuf = binary.AppendUvarint(t.valBuf[:0], uint64(len(id)))
		t.valBuf = append(t.valBuf, id...)
		t.valBuf = lease.AppendRecord(t.valBuf, &next)
		written, err := p.host.SharedSet(key, t.valBuf, cas)
		if err != nil {
			return wire.Delta{}, "", false
		}
		if !written {
			continue // a worker decided on it meanwhile: cut again
		}
		if !known {
			// The rule (or this window of it) is gone from the rule set: nothing can
			// charge what it consumed any more.
			p.m.inc(p.m.deltasRuleGone)
			return wire.Delta{}, "", false
		}
		d.Key, d.Rule, d.Tier, d.Window = ck, ruleID, tier, uint8(w)
		d.Algo, d.Limit, d.WindowMs, d.Burst = uint8(prm.Kind), u32(prm.Limit), u32(prm.WindowUs/1000), u32(prm.Burst)
		return d, string(id), true
	}
	return wire.Delta{}, "", false
}

// params resolves a bucket's parameters from the current rule set.
func (s *syncer) params(ruleID, tier, key string, w int) (prm algo.Params, ok bool) {
	r := s.p.cfg.RuleByID(ruleID)
	if r == nil {
		return prm, false
	}
	return r.Params(key, tier, w)
}

// send dispatches body, the batch in s.batch.
func (s *syncer) send(now int64, body []byte) {
	p := s.p
	cfg := s.cfg()
	token, err := p.host.HTTPCall(cfg.Cluster, p.callHeaders("/v1/sync"), body, uint32(cfg.TimeoutMs))
	if err != nil {
		p.host.Log(LogWarn, "tollgate: sync callout to "+strconv.Quote(cfg.Cluster)+": "+err.Error())
		s.failed(now, true)
		return
	}
	s.inflight, s.token, s.hedge, s.sentUs = true, token, 0, now
	p.calls[token] = call{kind: callSync}
	s.setState(func(st *syncState) { st.SentUs = now })
	p.m.inc(p.m.syncSent)
	p.m.add(p.m.batchDeltas, int64(len(s.batch.Deltas)))
}

// sendHedge sends the batch in flight again on a second callout: the first is still
// unanswered at the tick after it was sent, which a healthy service never does. If the
// first was lost, the hedge's answer arrives before the gateway counts as degraded; if
// both arrive, the service answers the second as a replay (same node and seq) and the
// first answer is the one applied.
func (s *syncer) sendHedge() {
	p := s.p
	cfg := s.cfg()
	body, err := wire.AppendBatch(p.callBuf[:0], &s.batch)
	if err != nil {
		return
	}
	p.callBuf = body
	token, err := p.host.HTTPCall(cfg.Cluster, p.callHeaders("/v1/sync"), body, uint32(cfg.TimeoutMs))
	if err != nil {
		return // the first callout is still waiting
	}
	s.hedge = token
	p.calls[token] = call{kind: callSync}
	p.m.inc(p.m.syncSent)
}

// probe runs on every tick: while the batch in flight has waited a quarter interval, the
// leader asks the service's wire.AlivePath every half interval. A 200 is a sign of life
// (answered), so a sync that is slow — Redis busy, the service loaded — does not make the
// gateway degraded: only a failed sync, one that timed out (the callout's timeout_ms), or
// a service that answers nothing alive for two intervals does (healthyNow). A hung
// service answers no probe, one that is down refuses it, and one whose Redis has stalled
// answers 503, so each is counted down within two intervals and a quarter of its last
// answer. A healthy sync is answered long before a quarter interval, and then no probe
// is sent.
func (s *syncer) probe(now int64) {
	iv := s.intervalUs()
	if !s.inflight || s.probeToken != 0 || now-s.sentUs < iv/4 || now-s.probeUs < iv/2 || s.term == 0 {
		return
	}
	cfg := s.cfg()
	hdr := append(s.p.hdrBuf[:0], [2]string{":method", "GET"}, [2]string{":path", wire.AlivePath}, [2]string{":authority", cfg.Authority})
	s.p.hdrBuf = hdr
	token, err := s.p.host.HTTPCall(cfg.Cluster, hdr, nil, uint32(cfg.TimeoutMs))
	if err != nil {
		return
	}
	s.probeToken, s.probeUs = token, now
	s.p.calls[token] = call{kind: callProbe}
}

// onProbe takes a probe's answer: a 200 is the service's, so it is alive.
func (s *syncer) onProbe(now int64, token uint32, headers [][2]string) {
	if token == s.probeToken {
		s.probeToken = 0
	}
	if headerValue(headers, ":status") == "200" {
		s.answered(now)
	}
}

// answered records that the service just answered a check, an acquire or a probe: it
// is alive, so a sync reply that is merely slow does not make the gateway degraded while
// other callouts are answered (a hung service answers none).
func (s *syncer) answered(now int64) {
	if now-s.state.LastOkUs < s.intervalUs()/2 {
		return // recent enough: spare the shared write
	}
	s.setState(func(st *syncState) { st.LastOkUs = max(st.LastOkUs, now) })
}

// answers reports whether token is a callout of the batch in flight.
func (s *syncer) answers(token uint32) bool {
	return s.inflight && (token == s.token || (s.hedge != 0 && token == s.hedge))
}

// setState applies f to syncKey (bounded CAS) and to this worker's copy.
func (s *syncer) setState(f func(*syncState)) {
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		v, cas, found, err := s.p.host.SharedGet(syncKey)
		if err != nil {
			break
		}
		var st syncState
		if !found || st.decode(v) != nil {
			st, cas = s.state, 0
		}
		f(&st)
		s.buf = st.append(s.buf[:0])
		if ok, err := s.p.host.SharedSet(syncKey, s.buf, cas); err != nil || ok {
			s.state = st
			return
		}
	}
	f(&s.state)
}

// failed counts a failed sync: the breaker backs off (one interval, doubling up to
// breaker_open_ms) and the batch stays to be resent. hard is a failure the service (or
// the connection) reported, as opposed to a call that timed out or was reset (a lone
// lost callout never gets here: its hedge answers first).
func (s *syncer) failed(now int64, hard bool) {
	s.p.m.inc(s.p.m.syncFailed)
	iv := s.intervalUs()
	s.setState(func(st *syncState) {
		st.Failures++
		st.Hard = hard
		st.SentUs = 0
		backoff := iv << min(st.Failures-1, 20)
		st.OpenUntilUs = now + min(backoff, max(s.cfg().BreakerOpenMs*1000, iv))
	})
	s.gauge(now)
}

// onResponse handles the reply to the batch in flight (to either of its callouts).
func (s *syncer) onResponse(now int64, token uint32, headers [][2]string, body []byte) {
	p := s.p
	status := headerValue(headers, ":status")
	if status != "200" && s.hedge != 0 {
		// One of two callouts of the batch failed: the other may still bring the answer.
		if token == s.hedge {
			s.hedge = 0
		} else {
			s.token, s.hedge = s.hedge, 0
		}
		return
	}
	s.inflight, s.hedge = false, 0
	s.refresh(now, 0)
	switch {
	case status == "200":
		p.m.set(p.m.syncRTT, uint64(max(0, now-s.sentUs)/1000))
	case len(status) == 3 && status[0] == '4' && status != "429" && status != "408":
		// The service will never accept this batch (wrong secret, too large): resending
		// it forever would block every later report. Its consumption goes back to the
		// buckets, to be reported once the service accepts batches again.
		p.host.Log(LogError, "tollgate: sync batch "+strconv.FormatUint(s.batch.Seq, 10)+" refused with "+status+": "+string(truncate(body, 200)))
		p.m.inc(p.m.syncDropped)
		s.uncut(now)
		s.setState(func(st *syncState) { st.Unacked = false })
		s.failed(now, true)
		// The service answered, so it is up: it refuses this gateway's batches (a rotated
		// secret, a batch too large). The next batch goes after one interval instead of a
		// growing backoff, so the gateway is back as soon as the service would accept it.
		iv := s.intervalUs()
		s.setState(func(st *syncState) { st.OpenUntilUs = now + iv })
		return
	default:
		// Timeout (504), reset (no status), 5xx: keep the batch, resend the same seq.
		hard := status != "" && status != "504"
		s.failed(now, hard)
		if hard && s.state.Failures < uint32(max(1, s.cfg().BreakerFailures)) {
			// A failure the service or the connection reported is resent at once instead
			// of after a backoff, until the breaker opens: behind a cluster of several
			// replicas the resend goes to the next one (other callouts of this worker may
			// have taken the next turn, hence more than one), so one dead replica costs a
			// few milliseconds, not the two intervals without a success that make the
			// gateway degraded. A dead service gets breaker_failures quick refusals, then
			// the usual backoff.
			s.setState(func(st *syncState) { st.OpenUntilUs = 0 })
			s.run(now)
		}
		return
	}
	var reply wire.Reply
	if err := wire.DecodeReply(body, &reply); err != nil || len(reply.States) != len(s.batch.Deltas) {
		msg := "states do not answer the deltas"
		if err != nil {
			msg = err.Error()
		}
		p.host.Log(LogError, "tollgate: sync reply: "+msg)
		s.failed(now, true)
		return
	}
	for i := range reply.States {
		s.apply(now, &reply.States[i], &s.batch.Deltas[i], s.ids[i], uint32(s.batch.Seq))
	}
	nodes := reply.Nodes
	s.setState(func(st *syncState) {
		st.Failures, st.Hard, st.OpenUntilUs, st.SentUs, st.LastOkUs = 0, false, 0, 0, now
		if len(s.batch.Deltas) > 0 && st.Seq == s.batch.Seq {
			st.Unacked = false
		}
		if nodes > 0 {
			st.Nodes = nodes
		}
		st.RulesVersion = max(st.RulesVersion, reply.RulesVersion)
	})
	s.batch.Deltas = s.batch.Deltas[:0]
	s.gauge(now)
	if reply.RulesVersion > p.rulesVersion {
		p.rulesBehind(reply.RulesVersion)
	}
}

// apply folds one state into its bucket's record (bounded CAS).
func (s *syncer) apply(now int64, st *wire.State, d *wire.Delta, id string, seq uint32) {
	p := s.p
	if st.Key != d.Key || st.Rule != d.Rule || st.Window != d.Window {
		return
	}
	if st.Lease > 0 {
		p.m.add(p.m.leaseGranted, int64(st.Lease))
	}
	var sl slot
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		if err := p.table.load(id, now, &sl); err != nil || !sl.mine {
			// Evicted meanwhile: a grant it carried stays reserved at the service until
			// its epoch ends.
			return
		}
		rec := sl.rec
		var returned int64
		if st.Flags&wire.StateRefused != 0 {
			// The service will never take this delta: forget it.
			if rec.CutSeq == seq {
				rec.CutSeq = 0
				if d.Flags&wire.FlagRate != 0 {
					rec.Rate, rec.Stock = 0, 0 // it stopped accruing with the cut, and nothing renews it
				}
			}
			p.m.inc(p.m.deltasRefused)
		} else {
			rec, returned = lease.ApplyReply(rec, st, d, seq, now)
			// lease_ttl_ms caps the lease, or a few of the key's gaps for a slow key, so
			// that its lease outlives them (lease.UseUs).
			rec.LeaseUntilUs = min(rec.LeaseUntilUs, now+lease.UseUs(d, s.cfg().LeaseTTLMs*1000, s.staleUs()))
			rec = s.batchRetry(rec, lease.ParamsOf(d), int64(d.Rejected)+rec.Pending.Rejected, now)
			if returned > 0 && !rec.Urgent {
				rec.Urgent = true
			}
		}
		sl.rec = rec
		ok, err := p.table.store(id, &sl)
		if err != nil {
			return
		}
		if ok {
			if returned > 0 {
				s.queue(uint32(sl.n))
			}
			if st.Flags&wire.StateRefused != 0 && st.Reason != "" {
				p.host.Log(LogWarn, "tollgate: the service refused a report of rule "+strconv.Quote(d.Rule)+": "+st.Reason)
			}
			return
		}
	}
}

// batchRetry holds a gateway refusing far more than the bucket refills off the service
// until the next sync interval (lease.BatchRetry).
func (s *syncer) batchRetry(rec lease.Record, params algo.Params, rejected, now int64) lease.Record {
	return lease.BatchRetry(rec, params, rejected, now, s.intervalUs())
}

// uncut gives a refused batch's consumption back to its buckets.
func (s *syncer) uncut(now int64) {
	p := s.p
	for i := range s.batch.Deltas {
		d := &s.batch.Deltas[i]
		var sl slot
		for attempt := 0; attempt < maxCASAttempts; attempt++ {
			if p.table.load(s.ids[i], now, &sl) != nil || !sl.mine {
				break
			}
			sl.rec = lease.Uncut(sl.rec, d, uint32(s.batch.Seq))
			if ok, err := p.table.store(s.ids[i], &sl); err != nil || ok {
				break
			}
		}
	}
	s.batch.Deltas = s.batch.Deltas[:0]
}

// maxBatchBytes caps one batch's encoding (and its reply's).
const maxBatchBytes = wire.MaxBatchSize / 4

// The longest one delta, and the state answering it, can encode.
var (
	maxDeltaSize = wire.DeltaSize(&wire.Delta{Key: longString, Rule: longString, Tier: longString,
		Leased: 1<<32 - 1, Over: 1<<32 - 1, Returned: 1<<32 - 1, Held: 1<<32 - 1, Rejected: 1<<32 - 1,
		Early: 1<<32 - 1, Epoch: 1<<32 - 1, ElapsedMs: 1<<32 - 1, Limit: 1<<32 - 1, WindowMs: 1<<32 - 1, Burst: 1<<32 - 1,
		Flags: wire.FlagWant, Want: 1<<32 - 1})
	maxStateSize = wire.MaxStateSize(&wire.Delta{Key: longString, Rule: longString})
)

const longString = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" +
	"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" +
	"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" +
	"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func (p *Plugin) callHeaders(path string) [][2]string {
	cfg := &p.cfg.Sync
	h := append(p.hdrBuf[:0],
		[2]string{":method", "POST"},
		[2]string{":path", path},
		[2]string{":authority", cfg.Authority},
		[2]string{"content-type", "application/octet-stream"},
	)
	if cfg.Secret != "" {
		h = append(h, [2]string{"authorization", p.bearer})
	}
	p.hdrBuf = h
	return h
}

// bucketID names a bucket: rule, window, tier and caller key, separated by a byte that
// cannot appear in a rule id or a tier name (the key goes last: it may contain it).
func bucketID(buf *[]byte, key, rule, tier string, window int) string {
	*buf = appendBucketID((*buf)[:0], key, rule, tier, window)
	return string(*buf)
}

// appendBucketID appends a bucket's id: rule, window, tier and key separated by 0x1f.
func appendBucketID(b []byte, key, rule, tier string, window int) []byte {
	b = append(b, rule...)
	b = append(b, 0x1f)
	b = strconv.AppendInt(b, int64(window), 10)
	b = append(b, 0x1f)
	b = append(b, tier...)
	b = append(b, 0x1f)
	return append(b, key...)
}

// parseBucketID splits a bucket id.
func parseBucketID(id []byte) (rule string, window int, tier, key string, ok bool) {
	var parts [3]int
	n := 0
	for i := 0; i < len(id) && n < 3; i++ {
		if id[i] == 0x1f {
			parts[n] = i
			n++
		}
	}
	if n < 3 {
		return "", 0, "", "", false
	}
	w, err := strconv.Atoi(string(id[parts[0]+1 : parts[1]]))
	if err != nil || w < 0 || w > 255 {
		return "", 0, "", "", false
	}
	return string(id[:parts[0]]), w, string(id[parts[1]+1 : parts[2]]), string(id[parts[2]+1:]), true
}

func headerValue(h [][2]string, name string) string {
	for _, kv := range h {
		if kv[0] == name {
			return kv[1]
		}
	}
	return ""
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

func u32(v int64) uint32 {
	if v < 0 {
		return 0
	}
	if v > 1<<32-1 {
		return 1<<32 - 1
	}
	return uint32(v)
}

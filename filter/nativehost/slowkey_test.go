package nativehost_test

import (
	"strconv"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/nativehost"
)

// TestSlowKeyIsNotHeld: a key that comes back every second or so, on the shipped sync
// settings (lease_ttl_ms 1000), with a bucket of 1,000 a second it never comes near
// (BENCHMARKS.md §13's regime).
//
// Its requests are never held for an acquire: after a pause of seven seconds its lease
// is 2 permits (its demand over the pause), and while the renewal the first two ask for
// waits for a slow sync (answered 400 ms late, the probes at once, as a loaded service
// does), the third finds the lease valid but dry with the bucket nearly full; it is
// decided within the cold-start allowance (lease.Decide, step 4) instead of waiting for
// the service — before, it waited for an acquire's round trip.
//
// And it is not reported at every request: its lease is used for eight of its gaps
// (lease.UseUs) instead of ending before the next request — before, every request of
// a key back every 1.3 s was a delta (admitted cold after its lease ended, or out of a
// lease within the renewal window), 19 for 20.
func TestSlowKeyIsNotHeld(t *testing.T) {
	f := newFleetSync(t, 1, 2, `"lease_ttl_ms":1000,"expected_nodes":1,"stale_ms":10000`,
		`[{"id":"api","algorithm":"token_bucket","limit":1000,"window":"1s"}]`)
	f.settle()
	gw := f.gws[0]
	var late []*nativehost.Callout // sync batches the slow service has not answered yet
	slow := false
	answer := func(c *nativehost.Callout) {
		status, body := f.svc.Handle(c.Header(":path"), c.Body, f.now)
		gw.Respond(c, [][2]string{{":status", strconv.Itoa(status)}}, body)
	}
	flush := func() {
		for _, c := range gw.TakeCallouts() {
			if slow && c.Header(":path") == "/v1/sync" {
				late = append(late, c)
				continue
			}
			answer(c)
		}
	}
	wait := func(ms int) {
		for ; ms > 0; ms -= 25 {
			f.now += 25_000
			for w := range gw.Workers() {
				gw.Tick(w)
			}
			flush()
		}
	}
	held, sent := 0, 0
	request := func() {
		s := gw.Request(sent%2, [][2]string{{":method", "GET"}, {":path", "/api"}, {":authority", "a"}, {"x-api-key", "slow"}}, nil)
		sent++
		if s.Paused {
			held++
		}
		flush()
		for i := 0; !s.Decided && i < 40; i++ {
			wait(5)
		}
		if !s.Admitted() {
			t.Fatalf("request %d: status %d, want admitted", sent, s.Status())
		}
	}
	request()
	wait(7000)
	request() // its lease ended: admitted cold, reported
	wait(300) // the reply: a lease of 2
	slow = true
	for range 3 {
		wait(110)
		request()
	}
	if held != 0 {
		t.Fatalf("%d of %d requests held for an acquire, want none (records: %s)", held, sent, f.records("slow"))
	}
	if gw.Metric("tollgate.answers_degraded") != 0 {
		t.Fatalf("degraded answers while the probes were answered")
	}
	slow = false
	for _, c := range late {
		answer(c)
	}
	wait(200)

	// Every 1.3 s for 26 s.
	deltas0, sent0 := gw.Metric("tollgate.sync_deltas_sent"), sent
	for range 20 {
		wait(1300)
		request()
	}
	deltas, n := gw.Metric("tollgate.sync_deltas_sent")-deltas0, sent-sent0
	if held != 0 || deltas*3 > int64(n) {
		t.Fatalf("a key every 1.3 s: %d requests held, %d deltas for %d requests, want none held and at most one delta per three requests", held, deltas, n)
	}
}

// TestHedgedSyncReplayIsNotTheBucket: a sync slower than half an interval is sent
// again on a second callout (a hedge); the service applies the batch once and answers
// the other callout as a replay, which carries the lease granted and nothing of the
// bucket (its remaining reads 0). When the replay's answer comes back first, the
// gateway applies the lease and keeps what it knew of the bucket: a key whose lease
// then ends is admitted on its allowance, not held for an acquire on a bucket it took
// for spent (before, it was: most of the acquires of the synced Envoy under load,
// BENCHMARKS.md §13).
func TestHedgedSyncReplayIsNotTheBucket(t *testing.T) {
	f := newFleetSync(t, 1, 2, `"lease_ttl_ms":1000,"expected_nodes":1`,
		`[{"id":"api","algorithm":"token_bucket","limit":1000,"window":"1s"}]`)
	f.settle()
	gw := f.gws[0]
	tick := func() {
		f.now += 25_000
		for w := range gw.Workers() {
			gw.Tick(w)
		}
	}
	req := func() *nativehost.Stream {
		return gw.Request(0, [][2]string{{":method", "GET"}, {":path", "/api"}, {":authority", "a"}, {"x-api-key", "k"}}, nil)
	}
	// The key's first request, answered as usual; it comes back after its lease ended:
	// admitted cold again, and reported.
	for i := range 2 {
		if s := req(); !s.Admitted() {
			t.Fatalf("request %d: %d, want admitted", i+1, s.Status())
		}
		if i == 0 {
			for range 80 {
				f.tick(25)
			}
		}
	}
	var syncs []*nativehost.Callout
	for i := 0; len(syncs) < 2 && i < 20; i++ {
		tick()
		for _, c := range gw.TakeCallouts() {
			if c.Header(":path") == "/v1/sync" {
				syncs = append(syncs, c)
			} else {
				status, body := f.svc.Handle(c.Header(":path"), c.Body, f.now)
				gw.Respond(c, [][2]string{{":status", strconv.Itoa(status)}}, body)
			}
		}
	}
	if len(syncs) != 2 {
		t.Fatalf("%d sync callouts, want the batch and its hedge", len(syncs))
	}
	// The service applies the first, and answers the hedge as a replay; the replay's
	// answer reaches the gateway first.
	_, _ = f.svc.Handle("/v1/sync", syncs[0].Body, f.now)
	status, body := f.svc.Handle("/v1/sync", syncs[1].Body, f.now)
	if f.svc.Replays == 0 {
		t.Fatalf("the hedge was not a replay")
	}
	gw.Respond(syncs[1], [][2]string{{":status", strconv.Itoa(status)}}, body)
	for range 80 { // two seconds: the lease (1 s) ends
		f.tick(25)
	}
	if s := req(); s.Paused || !s.Admitted() {
		t.Fatalf("the key back after its lease ended: paused %v, status %d, want admitted without an acquire (records: %s)",
			s.Paused, s.Status(), f.records("k"))
	}
}

package plugin_test

import (
	"testing"

	"github.com/tollgate-rl/tollgate/filter/nativehost"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TestSharedAcquire: the first requests of a fresh key on both workers of one Envoy ask
// the service once. The first request sends the acquire; the two that arrive before its
// answer (one on each worker) wait for it, and the acquire carries their cost (Want).
// The answer's lease admits the waiting request on the answering worker at once and the
// one on the other worker at its next tick; no further callout goes out.
func TestSharedAcquire(t *testing.T) {
	now := int64(t0)
	h, err := nativehost.New(nativehost.Config{Workers: 2, Clock: func() int64 { return now }, Seed: 1, PluginConfig: []byte(
		`{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
		"sync":{"cluster":"svc","interval_ms":100},
		"rules":[{"id":"api","limit":10,"window":"1h","cold_start":"bounded"}]}`)})
	if err != nil {
		t.Fatal(err)
	}
	req := [][2]string{{":method", "GET"}, {":path", "/"}, {":authority", "a"}, {"x-api-key", "fresh"}}
	first := h.Request(0, req, nil)
	second := h.Request(1, req, nil)
	third := h.Request(0, req, nil)
	calls := h.TakeCallouts()
	if len(calls) != 1 || calls[0].Header(":path") != "/v1/check" {
		t.Fatalf("%d callouts, want one acquire", len(calls))
	}
	var b wire.Batch
	if err := wire.DecodeBatch(calls[0].Body, &b); err != nil || len(b.Deltas) != 1 {
		t.Fatalf("acquire batch %+v: %v", b, err)
	}
	if d := b.Deltas[0]; d.Flags&wire.FlagAcquire == 0 || d.Over != 1 || d.Want != 0 {
		t.Fatalf("first acquire %+v: want Over 1 and no Want (nothing waited yet)", d)
	}
	if !first.Paused || !second.Paused || !third.Paused {
		t.Fatalf("paused: %v %v %v, want all three waiting", first.Paused, second.Paused, third.Paused)
	}
	if n := h.Metric("tollgate.acquires_shared"); n != 2 {
		t.Fatalf("acquires_shared %d, want 2", n)
	}
	// The service admits the first and leases 2: what waits.
	reply := wire.Reply{Nodes: 1, States: []wire.State{{Key: "fresh", Rule: "api", Flags: wire.StateAllowed,
		Remaining: 7, Lease: 2, Epoch: 9, ValidMs: 20_000, ResetInMs: 3_600_000, ServerMs: 1}}}
	body, err := wire.AppendReply(nil, &reply)
	if err != nil {
		t.Fatal(err)
	}
	h.Respond(calls[0], [][2]string{{":status", "200"}}, body)
	if !first.Admitted() || !third.Admitted() {
		t.Fatalf("on the answering worker: first %v, third %v, want both admitted", first.Admitted(), third.Admitted())
	}
	if second.Decided {
		t.Fatalf("the other worker's request decided before its tick")
	}
	now += 5_000
	h.Tick(1)
	if !second.Admitted() {
		t.Fatalf("the other worker's request after its tick: decided %v, status %d", second.Decided, second.Status())
	}
	for _, c := range h.TakeCallouts() {
		if c.Header(":path") != "/v1/sync" {
			t.Fatalf("a callout to %s, want none but the sync: the lease covered every waiting request", c.Header(":path"))
		}
	}
	if n := h.Metric("tollgate.acquires"); n != 1 {
		t.Fatalf("acquires %d, want 1", n)
	}

	// A second burst on a new key: the lease of its first answer covers only the
	// requester; the waiting requests then ask once more, for what still waits (Want 2).
	req[3][1] = "fresh2"
	a, b2, c := h.Request(0, req, nil), h.Request(0, req, nil), h.Request(1, req, nil)
	calls = h.TakeCallouts()
	if len(calls) != 1 {
		t.Fatalf("second key: %d callouts, want one", len(calls))
	}
	reply.States[0].Key, reply.States[0].Lease, reply.States[0].ServerMs = "fresh2", 0, 2
	body, _ = wire.AppendReply(nil, &reply)
	h.Respond(calls[0], [][2]string{{":status", "200"}}, body)
	if !a.Admitted() || b2.Decided {
		t.Fatalf("second key: first %v, second decided %v; want the first admitted, the second waiting", a.Admitted(), b2.Decided)
	}
	calls = h.TakeCallouts()
	if len(calls) != 1 {
		t.Fatalf("second key, second round: %d callouts, want one", len(calls))
	}
	if err := wire.DecodeBatch(calls[0].Body, &b); err != nil || b.Deltas[0].Want != 1 || b.Deltas[0].Flags&wire.FlagWant == 0 {
		t.Fatalf("second round asks %+v (%v), want Want 1 (the request on the other worker)", b.Deltas, err)
	}
	reply.States[0].Lease, reply.States[0].ServerMs = 1, 3
	body, _ = wire.AppendReply(nil, &reply)
	h.Respond(calls[0], [][2]string{{":status", "200"}}, body)
	now += 5_000
	h.Tick(1)
	if !b2.Admitted() || !c.Admitted() {
		t.Fatalf("second key after the second round: %v %v, want both admitted", b2.Admitted(), c.Admitted())
	}
}

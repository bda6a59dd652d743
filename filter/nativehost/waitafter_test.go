package nativehost_test

import (
	"strconv"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/nativehost"
)

// A request of two buckets leads the acquire of one and waits for another request's
// acquire of the other. Its own answer comes first: it then waits on for the other
// answer, and is decided when that comes — not dropped because its own callout was
// answered (a request held forever: seen in the Envoy soak, where every request has a
// key's plan bucket and its path's).
func TestWaitsOnAfterItsOwnAnswer(t *testing.T) {
	f := newFleet(t, 1, 2, `[{"id":"plan","limit":100,"window":"1h","cold_start":"wait"},
		{"id":"b","match":{"prefix":"/b"},"limit":100,"window":"1h","cold_start":"wait"}]`)
	f.settle()
	gw := f.gws[0]
	req := func(w int, path string) *nativehost.Stream {
		return gw.Request(w, [][2]string{{":method", "GET"}, {":path", path}, {":authority", "a"}, {"x-api-key", "k"}}, nil)
	}
	respond := func(c *nativehost.Callout) {
		status, body := f.svc.Handle(c.Header(":path"), c.Body, f.now)
		gw.Respond(c, [][2]string{{":status", strconv.Itoa(status)}}, body)
	}
	other := req(1, "/a") // leads the plan bucket's acquire
	first := gw.TakeCallouts()
	if len(first) != 1 || !other.Paused {
		t.Fatalf("the first request: %d callouts, paused %v; want 1 acquire, paused", len(first), other.Paused)
	}
	s := req(0, "/b") // joins plan's acquire, leads b's
	second := gw.TakeCallouts()
	if len(second) != 1 || !s.Paused {
		t.Fatalf("the second request: %d callouts, paused %v; want 1 acquire (b's), paused", len(second), s.Paused)
	}
	respond(second[0]) // its own answer first: b is granted, plan is still asked for
	if s.Decided {
		t.Fatalf("decided before the plan bucket's acquire was answered: %+v", s.Local)
	}
	respond(first[0])
	for range 4 {
		f.tick(5)
	}
	if !other.Decided || !other.Admitted() {
		t.Errorf("the first request: decided %v, admitted %v", other.Decided, other.Admitted())
	}
	if !s.Decided || !s.Admitted() {
		t.Fatalf("the request that waited on after its own answer: decided %v, admitted %v (held forever)", s.Decided, s.Admitted())
	}
}

package nativehost_test

import (
	"testing"

	"github.com/tollgate-rl/tollgate/filter/nativehost"
	"github.com/tollgate-rl/tollgate/shared/header"
)

// A request held for its own callout (a strict check, or an acquire of a key without a
// lease) whose answer the host never delivers is answered, degraded, once the callout is
// overdue (plugin lostCalloutUs: twice the 250 ms timeout and a sync interval), and
// counted in checks_lost, while the sync keeps the gateway healthy; a request never
// hangs on the host.
func TestLostCalloutIsSettled(t *testing.T) {
	tests := []struct{ name, rules string }{
		{"strict", `[{"id":"api","limit":100,"window":"1h","strict":true}]`},
		{"acquire", `[{"id":"api","limit":100,"window":"1h","cold_start":"wait"}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFleet(t, 1, 1, tt.rules)
			f.settle()
			f.lose = func(c *nativehost.Callout) bool { return c.Header(":path") == "/v1/check" }
			s := f.send(0, 0, "k")
			if !s.Paused || s.Decided {
				t.Fatalf("request not held for its callout (paused %v, decided %v)", s.Paused, s.Decided)
			}
			for ms := 25; ms <= 575; ms += 25 {
				f.tick(25)
				if s.Decided {
					t.Fatalf("answered %d ms after its callout went out, before it was overdue", ms)
				}
			}
			for ms := 600; ms <= 700 && !s.Decided; ms += 25 {
				f.tick(25)
			}
			if !s.Decided || !s.Admitted() {
				t.Fatalf("not admitted degraded once its callout was overdue (decided %v, local %+v)", s.Decided, s.Local)
			}
			if v, _ := headerOf(s.Response, header.XPolicy); v != header.PolicyDegraded {
				t.Errorf("%s %q, want %q (headers %v)", header.XPolicy, v, header.PolicyDegraded, s.Response)
			}
			if n := f.metric("tollgate.checks_lost"); n != 1 {
				t.Errorf("checks_lost %d, want 1", n)
			}
			if n := f.metric("tollgate.checks_failed"); n != 1 {
				t.Errorf("checks_failed %d, want 1", n)
			}
			// The gateway stayed healthy: the next request of another key is decided
			// normally once the host delivers again.
			f.lose = nil
			if s2 := f.send(0, 0, "k2"); !s2.Decided || !s2.Admitted() {
				t.Errorf("the next request after the lost callout was not admitted: decided %v", s2.Decided)
			}
		})
	}
}

func headerOf(h [][2]string, name string) (string, bool) {
	for _, kv := range h {
		if kv[0] == name {
			return kv[1], true
		}
	}
	return "", false
}

package plugin_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/memservice"
	"github.com/tollgate-rl/tollgate/shared/lease"
)

// syncedGateway is a gateway that syncs with memservice (the service's lease logic
// without Redis); every reply reaches the gateway latencyUs after the service computed
// it, as over a network.
type syncedGateway struct {
	*gateway
	svc       *memservice.Service
	latencyUs int64
}

func newSyncedGateway(t *testing.T, rules string, latencyUs int64) *syncedGateway {
	t.Helper()
	g := &syncedGateway{gateway: newGateway(t, `{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
		"sync":{"cluster":"svc","interval_ms":100},"rules":`+rules+`}`), svc: memservice.New(lease.SyncConfig{}), latencyUs: latencyUs}
	g.svc.NoPenalty = true
	return g
}

// deliver answers every waiting callout: the service decides at the current time, the
// gateway reads the answer latencyUs later (the clock moves by it).
func (g *syncedGateway) deliver() {
	for cs := g.h.TakeCallouts(); len(cs) > 0; cs = g.h.TakeCallouts() {
		type reply struct {
			c      int
			status int
			body   []byte
		}
		var rs []reply
		for i, c := range cs {
			status, body := g.svc.Handle(c.Header(":path"), c.Body, g.now)
			rs = append(rs, reply{i, status, body})
		}
		g.now += g.latencyUs
		for _, r := range rs {
			g.h.Respond(cs[r.c], [][2]string{{":status", strconv.Itoa(r.status)}}, r.body)
		}
	}
}

// at moves the clock to us (ticking every 25 ms on the way, syncing; of a long pause
// only the last 200 ms) and sends one request of key k.
func (g *syncedGateway) at(us int64, k string) map[string]string {
	g.now = max(g.now, us-200_000)
	for next := g.now - g.now%25_000 + 25_000; next <= us; next += 25_000 {
		g.now = max(g.now, next)
		g.h.Tick(0)
		g.deliver()
	}
	g.now = max(g.now, us)
	s := g.h.Request(0, [][2]string{{":method", "GET"}, {":path", "/v1/x"}, {":authority", "a"}, {"x-api-key", k}}, nil)
	g.deliver()
	if !s.Decided {
		g.t.Fatalf("request at %d still paused", us)
	}
	h := map[string]string{"status": strconv.Itoa(int(s.Status())), "body": answer(s)}
	for _, name := range []string{"x-ratelimit-reset", "x-ratelimit-remaining", "ratelimit", "retry-after", "x-ratelimit-policy"} {
		h[name] = s.Header(name)
	}
	return h
}

// tParam is the t of a ratelimit field ("name";r=1;t=2), -1 if none.
func tParam(field string) int64 {
	_, params, _ := strings.Cut(field, ";")
	if v, ok := sfParam(params, "t"); ok {
		return v
	}
	return -1
}

// A monthly quota through the sync service, whose replies take 2 ms to arrive: every
// answer's reset (x-ratelimit-reset, the ratelimit field's t, the 429 body's reset_at)
// is the month's boundary, as without sync. The service's reset is a duration from its
// clock, which lands 2 ms late on the gateway's: the header's whole second went one
// second past the boundary.
func TestCalendarResetExactThroughSync(t *testing.T) {
	g := newSyncedGateway(t, `[{"id":"plan","algorithm":"fixed_window","limit":3,"calendar":{"period":"month"}}]`, 2_000)
	boundary := time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	g.now = boundary - 2*3_600_000_000
	for i, us := range []int64{boundary - 3_000_000_000, boundary - 2_000_000_000, boundary - 1_000_000_000, boundary - 500_000_000, boundary - 1_234_567} {
		h := g.at(us, "k")
		where := fmt.Sprintf("request %d at boundary-%.3fs (%s)", i, float64(boundary-g.now)/1e6, h["body"])
		if h["x-ratelimit-policy"] == "degraded" {
			t.Fatalf("%s: degraded", where)
		}
		if want := strconv.FormatInt(boundary/1_000_000, 10); h["x-ratelimit-reset"] != want {
			t.Errorf("%s: x-ratelimit-reset %s, want the boundary %s", where, h["x-ratelimit-reset"], want)
		}
		wantT := (boundary - g.now + 999_999) / 1_000_000
		if got := tParam(h["ratelimit"]); got != wantT {
			t.Errorf("%s: ratelimit t=%d, want %d (to the boundary)", where, got, wantT)
		}
		if h["status"] == "429" {
			if want := time.UnixMicro(boundary).UTC().Format(time.RFC3339); !strings.Contains(h["body"], `"reset_at":"`+want+`"`) {
				t.Errorf("%s: the body's reset_at is not the boundary %s", where, want)
			}
		}
	}
}

// A token bucket through the sync service: x-ratelimit-reset says when the bucket is
// full again with what has been consumed, so every admitted request moves it by a
// permit's refill (1 s at 60 a minute) — also the requests a lease admits on the
// gateway between two replies of the service, as without sync.
func TestResetFollowsConsumptionThroughSync(t *testing.T) {
	for _, algorithm := range []string{"token_bucket", "gcra"} {
		t.Run(algorithm, func(t *testing.T) {
			rules := `[{"id":"api","algorithm":"` + algorithm + `","limit":60,"window":"1m"}]`
			alone := newGateway(t, `{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,"rules":`+rules+`}`)
			g := newSyncedGateway(t, rules, 0)
			start := int64(t0 + 1_000_000)
			g.at(start-200_000, "warm") // the first sync
			alone.now = start
			for i := 0; i < 12; i++ {
				h := g.at(start, "k")
				want := alone.send("/v1/x", "x-api-key: k").Header("x-ratelimit-reset")
				if h["x-ratelimit-reset"] != want || h["status"] != "200" {
					t.Fatalf("request %d (all at one instant): status %s, x-ratelimit-reset %s, want %s as without sync (%d s after the first)",
						i, h["status"], h["x-ratelimit-reset"], want, i+1)
				}
			}
		})
	}
}

// A request refused by two windows of one rule (2 a second and 3 a minute, both spent)
// is told to come back when both admit it: Retry-After is the minute window's, and the
// headers and the body speak of the window that refused it. The ratelimit field's t on
// a refusal names the same moment as Retry-After (draft-ietf-httpapi-ratelimit-headers-10,
// section 6: "the reset parameter value SHOULD reference the same point in time as the
// Retry-After field value").
func TestRefusalByTwoWindowsOneSource(t *testing.T) {
	for _, synced := range []bool{false, true} {
		t.Run(map[bool]string{false: "alone", true: "synced"}[synced], func(t *testing.T) {
			const rules = `[{"id":"api","algorithm":"fixed_window","windows":[{"limit":2,"window":"1s"},{"limit":3,"window":"1m"}]}]`
			var send func(us int64) map[string]string
			if synced {
				g := newSyncedGateway(t, rules, 0)
				send = func(us int64) map[string]string { return g.at(us, "k") }
			} else {
				g := newGateway(t, `{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,"rules":`+rules+`}`)
				send = func(us int64) map[string]string {
					g.now = us
					s := g.send("/v1/x", "x-api-key: k")
					return map[string]string{"status": strconv.Itoa(int(s.Status())), "body": answer(s), "retry-after": s.Header("retry-after"),
						"ratelimit": s.Header("ratelimit"), "x-ratelimit-reset": s.Header("x-ratelimit-reset")}
				}
			}
			minute := int64(t0 - t0%60_000_000 + 60_000_000) // the end of t0's minute
			send(t0 + 10_000_000)
			send(t0 + 30_000_000)
			send(t0 + 30_100_000) // both windows spent
			h := send(t0 + 30_200_000)
			if h["status"] != "429" {
				t.Fatalf("the 5th request: %s, want 429", h["body"])
			}
			want := (minute - int64(t0+30_200_000) + 999_999) / 1_000_000
			if h["retry-after"] != strconv.FormatInt(want, 10) {
				t.Errorf("retry-after %s, want %d (the minute window admits again at its end): %s", h["retry-after"], want, h["body"])
			}
			if got := tParam(h["ratelimit"]); strconv.FormatInt(got, 10) != h["retry-after"] {
				t.Errorf("ratelimit t=%d on a refusal, retry-after %s: want the same moment", got, h["retry-after"])
			}
			if h["x-ratelimit-reset"] != strconv.FormatInt(minute/1_000_000, 10) {
				t.Errorf("x-ratelimit-reset %s, want the minute window's end %d", h["x-ratelimit-reset"], minute/1_000_000)
			}
			if at := time.UnixMicro(minute).UTC().Format(time.RFC3339); !strings.Contains(h["body"], `"reset_at":"`+at+`"`) {
				t.Errorf("the body's reset_at is not the minute window's end %s: %s", at, h["body"])
			}
		})
	}
}

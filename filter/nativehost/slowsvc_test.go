package nativehost_test

import (
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/nativehost"
)

// A service too slow to answer some callouts within their timeout (504; it applied them)
// must never make
// the gateway refuse a caller far within its limit: such a request is admitted, from a
// lease or degraded, whatever is lost. Keys of limit 1,000 a second over one gateway of
// two workers, 2,000 requests a second in all: 5,000 keys (cold, 0.4 a second each) and
// 20 keys (warm, 100 a second each).
func TestSlowServiceRefusesNobodyWithinLimit(t *testing.T) {
	for _, tt := range []struct{ keys, lossPct int }{{5000, 10}, {5000, 50}, {5000, 90}, {20, 10}, {20, 50}, {20, 90}} {
		keys, lossPct := tt.keys, tt.lossPct
		t.Run(strconv.Itoa(keys)+"keys_"+strconv.Itoa(lossPct)+"pct_timeouts", func(t *testing.T) {
			f := newFleet(t, 1, 2, `[{"id":"api","limit":1000,"window":"1s"}]`)
			f.settle()
			gw := f.gws[0]
			rnd := rand.New(rand.NewPCG(1, uint64(lossPct)))
			answer := func() {
				for more := true; more; {
					more = false
					for _, c := range gw.TakeCallouts() {
						more = true
						if rnd.IntN(100) < lossPct {
							// Too slow: the service applies the call, its answer comes
							// after the callout's timeout.
							f.svc.Handle(c.Header(":path"), c.Body, f.now)
							gw.Fail(c, true)
							continue
						}
						status, body := f.svc.Handle(c.Header(":path"), c.Body, f.now)
						gw.Respond(c, [][2]string{{":status", strconv.Itoa(status)}}, body)
					}
				}
			}
			var pending []*nativehost.Stream
			refused, sent := 0, 0
			var firstRefusal *nativehost.LocalReply
			for round := 0; round < 400; round++ {
				for i := 0; i < 50; i++ {
					key := "k" + strconv.Itoa(rnd.IntN(keys))
					pending = append(pending, gw.Request(i%2, [][2]string{{":method", "GET"}, {":path", "/api"}, {":authority", "a"}, {"x-api-key", key}}, nil))
					sent++
				}
				answer()
				f.now += 25_000
				for w := range gw.Workers() {
					gw.Tick(w)
				}
				answer()
				kept := pending[:0]
				for _, s := range pending {
					switch {
					case !s.Decided:
						kept = append(kept, s)
					case s.Local != nil:
						refused++
						if firstRefusal == nil {
							firstRefusal = s.Local
						}
					}
				}
				pending = kept
			}
			if refused > 0 {
				t.Errorf("%d of %d requests refused, every caller far within its limit; first: %d %s %s", refused, sent,
					firstRefusal.Status, firstRefusal.Details, firstRefusal.Body)
			}
			if len(pending) > 0 {
				t.Errorf("%d requests still held at the end", len(pending))
			}
		})
	}
}

package nativehost_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/nativehost"
	"github.com/tollgate-rl/tollgate/filter/plugin"
)

// Shaping: a burst of 50 requests against 10 a second with max_delay 2s. The bucket's
// 10 go at once; the next 20 are held and let through one permit's time (100 ms) apart,
// each at most one shaping tick (5 ms) after its permit's time; the rest, whose permit
// is more than 2 s away, are refused. Held requests take the tick to 5 ms, and it goes
// back to none when the last is released.
func TestShapingSpacesABurst(t *testing.T) {
	for _, algorithm := range []string{"token_bucket", "gcra"} {
		t.Run(algorithm, func(t *testing.T) {
			const start = int64(1_700_000_000_000_000)
			now := start
			released := map[uint32]int64{}
			h, err := nativehost.New(nativehost.Config{
				Clock: func() int64 { return now },
				PluginConfig: []byte(`{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,"rules":[{"id":"api",
					"algorithm":"` + algorithm + `","limit":10,"window":"1s","burst":10,"max_delay":"2s"}]}`),
				OnDecided: func(s *nativehost.Stream) { released[s.ID] = now },
			})
			if err != nil {
				t.Fatal(err)
			}
			var held []*nativehost.Stream
			admitted, refused := 0, 0
			for i := 0; i < 50; i++ {
				s := h.Request(0, [][2]string{{":method", "GET"}, {":path", "/"}, {":authority", "a"}, {"x-api-key", "k"}}, nil)
				switch {
				case s.Paused:
					held = append(held, s)
				case s.Admitted():
					admitted++
				case s.Status() == 429:
					refused++
				default:
					t.Fatalf("request %d: status %d", i, s.Status())
				}
			}
			if admitted != 10 || len(held) != 20 || refused != 20 {
				t.Fatalf("%d admitted at once, %d held, %d refused; want 10, 20, 20", admitted, len(held), refused)
			}
			if p := h.TickPeriodMs(0); p != 5 {
				t.Errorf("tick period %d ms while requests are held, want 5", p)
			}
			for now < start+2_100_000 {
				now += 5_000
				h.Tick(0)
			}
			for k, s := range held {
				at, ok := released[s.ID]
				if !ok || !s.Admitted() {
					t.Fatalf("held request %d was not let through", k)
				}
				due := start + int64(k+1)*100_000
				if at < due || at > due+5_000 {
					t.Errorf("held request %d went on at %+d ms, want %d ms (its permit) to %d ms", k, (at-start)/1000, (due-start)/1000, (due-start)/1000+5)
				}
				if s.Header("x-ratelimit-limit") != "10" {
					t.Errorf("held request %d: headers %v", k, s.Response)
				}
			}
			if p := h.TickPeriodMs(0); p != plugin.MetricsFlushMs {
				t.Errorf("tick period %d ms with nothing held, want the base period %d", p, plugin.MetricsFlushMs)
			}
			if n := h.Metric("tollgate.requests_delayed"); n != 20 {
				t.Errorf("requests_delayed %d, want 20", n)
			}
		})
	}
}

// A held request whose client goes away is forgotten: its permit stays taken (the next
// request waits behind it, as with NGINX), nothing resumes the ended stream, and the tick
// goes back to none when no request is held any more.
func TestShapingHeldRequestReset(t *testing.T) {
	const start = int64(1_700_000_000_000_000)
	now := start
	h, err := nativehost.New(nativehost.Config{
		Clock: func() int64 { return now },
		PluginConfig: []byte(`{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,"rules":[{"id":"api",
			"limit":10,"window":"1s","burst":1,"max_delay":"1s"}]}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	req := [][2]string{{":method", "GET"}, {":path", "/"}, {":authority", "a"}, {"x-api-key", "k"}}
	if s := h.Request(0, req, nil); !s.Admitted() {
		t.Fatal("first request not admitted")
	}
	a, b := h.Request(0, req, nil), h.Request(0, req, nil)
	if !a.Paused || !b.Paused {
		t.Fatal("the next two are not held")
	}
	h.Reset(a)
	h.Reset(b)
	h.Tick(0) // the tick slows itself down (plugin.setTick says why)
	if p := h.TickPeriodMs(0); p != plugin.MetricsFlushMs {
		t.Errorf("tick period %d ms with nothing held, want the base period %d", p, plugin.MetricsFlushMs)
	}
	// Their permits (100 and 200 ms ahead) stay taken: the next request waits 300 ms.
	c := h.Request(0, req, nil)
	if !c.Paused {
		t.Fatal("the next request is not held behind the taken permits")
	}
	for now < start+295_000 {
		now += 5_000
		h.Tick(0)
		if c.Admitted() {
			t.Fatalf("released at %d ms, before its permit at 300 ms", (now-start)/1000)
		}
	}
	now += 10_000
	h.Tick(0)
	if !c.Admitted() {
		t.Fatal("not released after its permit's time")
	}
}

// TestTickPeriodSetOncePerTick: Envoy restarts the tick timer whenever a plugin sets its
// period, so a plugin that set it on every request held and let go would never tick
// under steady traffic, and the requests that wait for a tick would wait for ever. Here
// 100 requests are held and reset one after the other with no tick between them (a
// worker busier than one request per tick period): the period is set once (to the fast
// tick), and goes back to none only at the tick.
func TestTickPeriodSetOncePerTick(t *testing.T) {
	now := int64(1_700_000_000_000_000)
	h, err := nativehost.New(nativehost.Config{
		Clock: func() int64 { return now },
		PluginConfig: []byte(`{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,"rules":[{"id":"api",
			"limit":10,"window":"1s","burst":1,"max_delay":"1s"}]}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	base := h.TickPeriodSets(0)
	for i := 0; i < 100; i++ {
		now += 10_000 // 10 ms apart, 100 ms a permit: held, until the queue passes max_delay
		s := h.Request(0, [][2]string{{":method", "GET"}, {":path", "/"}, {":authority", "a"}, {"x-api-key", "k"}}, nil)
		if s.Paused {
			h.Reset(s)
		}
		if i == 0 {
			continue
		}
		if p := h.TickPeriodMs(0); p != 5 {
			t.Fatalf("request %d: tick period %d ms, want 5 until the next tick", i, p)
		}
	}
	if n := h.TickPeriodSets(0) - base; n != 1 {
		t.Errorf("tick period set %d times over 100 held requests without a tick, want 1", n)
	}
	h.Tick(0)
	if p := h.TickPeriodMs(0); p != plugin.MetricsFlushMs {
		t.Errorf("tick period %d ms after a tick with nothing held, want the base period %d", p, plugin.MetricsFlushMs)
	}
}

// Each row of SCHEMA.md's table beside NGINX's limit_req, for a burst of 30 requests at
// once: how many go at once, how many are held, how many are refused.
func TestShapingMatchesNGINX(t *testing.T) {
	tests := []struct {
		nginx, rule            string
		now, held, refusedWant int
	}{
		{"rate=10r/s", `"burst":1`, 1, 0, 29},
		{"burst=20 nodelay", `"burst":21`, 21, 0, 9},
		{"burst=20", `"burst":1,"max_delay":"2s"`, 1, 20, 9},
		{"burst=20 delay=10", `"burst":11,"max_delay":"1s"`, 11, 10, 9},
	}
	for _, tt := range tests {
		t.Run(tt.nginx, func(t *testing.T) {
			now := int64(1_700_000_000_000_000)
			h, err := nativehost.New(nativehost.Config{
				Clock: func() int64 { return now },
				PluginConfig: []byte(`{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"api",
					"algorithm":"gcra","limit":10,"window":"1s",` + tt.rule + `}]}`),
			})
			if err != nil {
				t.Fatal(err)
			}
			var at, held, refused int
			for i := 0; i < 30; i++ {
				s := h.Request(0, [][2]string{{":method", "GET"}, {":path", "/"}, {":authority", "a"}, {"x-api-key", "k"}}, nil)
				switch {
				case s.Paused:
					held++
				case s.Admitted():
					at++
				case s.Status() == 429:
					refused++
				}
			}
			if at != tt.now || held != tt.held || refused != tt.refusedWant {
				t.Errorf("%d at once, %d held, %d refused; want %d, %d, %d", at, held, refused, tt.now, tt.held, tt.refusedWant)
			}
		})
	}
}

// shapeBurst sends n concurrent requests of one key to a gateway (one worker) with a
// rule (gcra or token_bucket) of 10 a second, burst 1, max_delay 2s — with a sync service (the fleet's
// in-memory one, every callout answered once all n are in) or without — and then ticks
// every 5 ms for 2.5 s. It returns when each admitted request went on, from the first
// admission, in order.
func shapeBurst(t *testing.T, algorithm string, n int, withSync bool) []int64 {
	return shapeArrivals(t, algorithm, n, 0, withSync)
}

// shapeArrivals is shapeArrivalsIn with a fleet of one gateway.
func shapeArrivals(t *testing.T, algorithm string, n, gapMs int, withSync bool) []int64 {
	t.Helper()
	return shapeArrivalsIn(t, 1, algorithm, n, gapMs, withSync)
}

// shapeArrivalsIn is shapeBurst with the requests arriving gapMs apart (0: all at once,
// before any callout is answered), the clock ticking every 5 ms meanwhile, on the first
// gateway of a fleet of gateways (the others only sync: the service counts them).
func shapeArrivalsIn(t *testing.T, gateways int, algorithm string, n, gapMs int, withSync bool) []int64 {
	t.Helper()
	rules := `[{"id":"api","algorithm":"` + algorithm + `","limit":10,"window":"1s","burst":1,"max_delay":"2s"}]`
	f := newFleet(t, gateways, 1, rules)
	if !withSync {
		h, err := nativehost.New(nativehost.Config{
			Clock:        func() int64 { return f.now },
			PluginConfig: []byte(`{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,"rules":` + rules + `}`),
		})
		if err != nil {
			t.Fatal(err)
		}
		f.gws = []*nativehost.Host{h}
	}
	f.tick(100)
	for range 10 {
		f.tick(100) // every gateway syncs: the replies carry the fleet's size
	}
	h := f.gws[0]
	streams := make([]*nativehost.Stream, 0, n)
	start := f.now
	at := map[int]int64{}
	seen := func() {
		for i, s := range streams {
			if _, ok := at[i]; !ok && s.Admitted() {
				at[i] = f.now - start
			}
		}
	}
	next := f.now
	for len(streams) < n {
		if f.now >= next {
			streams = append(streams, h.Request(0, [][2]string{{":method", "GET"}, {":path", "/api"}, {":authority", "a"}, {"x-api-key", "k"}}, nil))
			next += int64(gapMs) * 1000
			if gapMs == 0 {
				continue
			}
			f.deliver()
		}
		seen()
		f.tick(5)
	}
	f.deliver() // the acquires, answered in the order they were sent
	seen()
	for end := f.now + 2_500_000; f.now < end; {
		f.tick(5)
		seen()
	}
	var out []int64
	for _, us := range at {
		out = append(out, us)
	}
	slices.Sort(out)
	for i, s := range streams {
		if !s.Decided {
			t.Fatalf("request %d undecided after 2.5 s (paused %v)", i, s.Paused)
		}
	}
	return out
}

// Shaping with a sync service admits and spaces a burst as shaping without one does:
// 30 concurrent first requests of a new key against 10 a second, burst 1, max_delay 2s.
// The first goes at once; the next 20 wait for their slots, 100 ms apart; the rest are
// refused. With sync the first request waits for its acquire and so do the others that
// arrive meanwhile: the service refuses those (the bucket holds one permit), and each
// such refusal whose permit comes within max_delay is a wait for its slot, decided on
// the gateway as without sync, not a 429.
//
// The same on the first gateway of a fleet of 41 that counts the others (a mesh, or the
// end-to-end suite's services, count dozens): a spent bucket's refusal on a fleet is
// spread over the fleet's time for a permit each, which must not move a shaped
// request's slot (it did: 2 admitted of 21, the rest told to come back in 4 to 55 s).
func TestShapingWithSyncLikeWithout(t *testing.T) {
	for _, gateways := range []int{1, 41} {
		for _, algorithm := range []string{"gcra", "token_bucket"} {
			t.Run(fmt.Sprintf("%s/fleet_of_%d", algorithm, gateways), func(t *testing.T) {
				without := shapeBurst(t, algorithm, 30, false)
				with := shapeArrivalsIn(t, gateways, algorithm, 30, 0, true)
				if len(without) != 21 {
					t.Fatalf("without sync: %d admitted, want 21 (1 at once, 20 held)", len(without))
				}
				sameShaping(t, with, without)
			})
		}
	}
}

// sameShaping requires the admissions with sync to match those without: as many, give
// or take one, and every gap between consecutive ones within one shaping tick.
func sameShaping(t *testing.T, with, without []int64) {
	t.Helper()
	t.Logf("admitted without sync %d, with sync %d", len(without), len(with))
	if d := len(with) - len(without); d < -1 || d > 1 {
		t.Fatalf("with sync: %d admitted (at %v ms), without %d: want within 1", len(with), ms(with), len(without))
	}
	for i := 1; i < min(len(with), len(without)); i++ {
		gw, gwo := with[i]-with[i-1], without[i]-without[i-1]
		if d := gw - gwo; d < -5_000 || d > 5_000 {
			t.Errorf("gap %d with sync %d ms, without %d ms: want within one tick (5 ms)\nwith:    %v\nwithout: %v",
				i, gw/1000, gwo/1000, ms(with), ms(without))
			break
		}
	}
}

func ms(us []int64) []int64 {
	out := make([]int64, len(us))
	for i, v := range us {
		out[i] = v / 1000
	}
	return out
}

// The same with requests arriving 50 ms apart, twice the rule's rate, for 2 s: each
// waits for the slot behind the previous one (100 ms apart) while the sync reports the
// permits taken ahead and its replies come back, so what the service says must keep
// the slots the gateway handed out.
func TestShapingWithSyncPacedLikeWithout(t *testing.T) {
	for _, algorithm := range []string{"gcra", "token_bucket"} {
		t.Run(algorithm, func(t *testing.T) {
			without := shapeArrivals(t, algorithm, 40, 50, false)
			with := shapeArrivals(t, algorithm, 40, 50, true)
			if len(without) != 40 {
				t.Fatalf("without sync: %d admitted, want all 40 (the last waits 1.95 s)", len(without))
			}
			sameShaping(t, with, without)
		})
	}
}

// Shaping one key on several gateways at once (a known limit, RATIONALE.md §3
// "Shaping"): each gateway spaces its own held requests by its own queue, and the
// service keeps at most one capacity of debt, so it cannot space them across gateways:
// a key shaped on N gateways gets up to N times its rate while all of them hold its
// requests. Each gateway here offers twice the rate for 2 s (10/s, burst 1, max_delay
// 2s): one gateway admits 40 in 4 s (the rule allows 41), two 80, four 160. The test
// holds that bound (N times one gateway's) so that it is measured on every run, and
// fails if it gets worse.
func TestShapingFleetBound(t *testing.T) {
	single := 0
	for _, gws := range []int{1, 2, 4} {
		f := newFleet(t, gws, 1, `[{"id":"api","algorithm":"gcra","limit":10,"window":"1s","burst":1,"max_delay":"2s"}]`)
		f.tick(100)
		var streams []*nativehost.Stream
		start := f.now
		for f.now < start+4_000_000 {
			if (f.now-start)%50_000 == 0 && f.now < start+2_000_000 {
				for g := range f.gws {
					streams = append(streams, f.gws[g].Request(0, [][2]string{{":method", "GET"}, {":path", "/api"}, {":authority", "a"}, {"x-api-key", "k"}}, nil))
				}
				f.deliver()
			}
			f.tick(5)
		}
		admitted := 0
		for _, s := range streams {
			if s.Admitted() {
				admitted++
			}
		}
		t.Logf("%d gateways: %d requests over 2 s, %d admitted within 4 s (one perfect bucket: 41)", gws, len(streams), admitted)
		if gws == 1 {
			single = admitted
			if admitted > 41 {
				t.Fatalf("one gateway admitted %d, more than the bucket's 41", admitted)
			}
		} else if admitted > gws*single {
			t.Fatalf("%d gateways admitted %d, more than %d times one gateway's %d", gws, admitted, gws, single)
		}
	}
}

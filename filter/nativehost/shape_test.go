package nativehost_test

import (
	"testing"

	"github.com/tollgate-rl/tollgate/filter/nativehost"
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
			if p := h.TickPeriodMs(0); p != 0 {
				t.Errorf("tick period %d ms with nothing held, want none (0)", p)
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
	if p := h.TickPeriodMs(0); p != 0 {
		t.Errorf("tick period %d ms with nothing held, want 0", p)
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

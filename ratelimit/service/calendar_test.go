package service

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/nativehost"
)

// TestCalendarQuotaGatewayAndUsage runs the filter (natively, on a virtual clock) synced
// with this service on a real Redis whose scripts read the same clock, through a month
// boundary at UTC+05:30: a monthly quota spent in January is refused just before
// 00:00 Feb 1 (+05:30) and admitted from it; the gateway's reset headers point at the
// boundary, and /v1/usage agrees with them: the same reset second, a fixed_window with
// the calendar, and nothing remaining once the gateway has admitted the month's limit.
func TestCalendarQuotaGatewayAndUsage(t *testing.T) {
	in := start(t, opts{})
	var clock atomic.Int64
	in.st.SetTestClock(clock.Load)
	zone := time.FixedZone("", 330*60)
	// in the past: the service refuses batches whose seq (the gateway's clock) runs
	// ahead of its own clock
	feb1 := time.Date(2024, 2, 1, 0, 0, 0, 0, zone).UnixMicro()
	mar1 := time.Date(2024, 3, 1, 0, 0, 0, 0, zone).UnixMicro()
	now := feb1 - 120_000_000
	clock.Store(now)
	cfg := fmt.Sprintf(`{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
		"sync":{"cluster":"svc","interval_ms":100,"secret":%q,"node":%q},
		"rules":[{"id":"plan","algorithm":"fixed_window","limit":5,"calendar":{"period":"month","utc_offset":"+05:30"}}]}`, syncSecret, in.id)
	h, err := nativehost.New(nativehost.Config{PluginConfig: []byte(cfg), Clock: func() int64 { return now }, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	// deliver forwards the gateway's callouts to the service over HTTP, at the gateway's
	// time (answers can cause more callouts).
	deliver := func() {
		t.Helper()
		for cs := h.TakeCallouts(); len(cs) > 0; cs = h.TakeCallouts() {
			for _, c := range cs {
				clock.Store(now)
				var hdr []string
				for _, kv := range c.Headers {
					if kv[0] != "" && kv[0][0] != ':' && kv[0] != "authorization" {
						hdr = append(hdr, kv[0], kv[1])
					}
				}
				code, _, body := in.do(t, http.MethodPost, c.Header(":path"), syncSecret, c.Body, hdr...)
				if code != http.StatusOK {
					t.Errorf("%s: %d %s", c.Header(":path"), code, body)
				}
				h.Respond(c, [][2]string{{":status", strconv.Itoa(code)}}, body)
			}
		}
	}
	// advance moves the clock to at in 25 ms ticks (the sync interval is 100 ms).
	advance := func(at int64) {
		for now+25_000 <= at {
			now += 25_000
			h.Tick(0)
			deliver()
		}
		now = at
	}
	key := in.id + "-k"
	send := func() (*nativehost.Stream, int64) {
		t.Helper()
		s := h.Request(0, [][2]string{{":method", "GET"}, {":path", "/v1/x"}, {":authority", "api.example.com"}, {"x-api-key", key}},
			map[string]string{"source.address": "10.1.2.3:50000"})
		deliver()
		if !s.Decided {
			t.Fatalf("request not decided")
		}
		reset, err := strconv.ParseInt(s.Header("x-ratelimit-reset"), 10, 64)
		if err != nil {
			t.Fatalf("x-ratelimit-reset %q", s.Header("x-ratelimit-reset"))
		}
		return s, reset
	}
	type usage struct {
		NowUs   int64 `json:"now_us"`
		Buckets []struct {
			Algorithm string            `json:"algorithm"`
			Calendar  map[string]string `json:"calendar"`
			Remaining int64             `json:"remaining"`
			ResetInMs int64             `json:"reset_in_ms"`
		}
	}
	getUsage := func() usage {
		t.Helper()
		clock.Store(now)
		code, _, out := in.do(t, http.MethodGet, "/v1/usage/"+key, adminToken, nil)
		var u usage
		if err := json.Unmarshal(out, &u); code != http.StatusOK || err != nil || len(u.Buckets) != 1 {
			t.Fatalf("usage: %d %s (%v)", code, out, err)
		}
		return u
	}
	// checkMonth sends requests until one is refused, lets the gateway report, and
	// compares its answers with /v1/usage.
	checkMonth := func(month string, boundary int64, admitted int) {
		t.Helper()
		var lastReset int64
		for i := 0; i < 20; i++ {
			s, reset := send()
			if reset != (boundary+999_999)/1e6 {
				t.Errorf("%s request %d: x-ratelimit-reset %d, want the boundary %d", month, i, reset, boundary/1e6)
			}
			lastReset = reset
			if s.Status() == 429 {
				if ra, _ := strconv.ParseInt(s.Header("retry-after"), 10, 64); ra != (boundary-now+999_999)/1e6 {
					t.Errorf("%s: retry-after %d, want %d", month, ra, (boundary-now+999_999)/1e6)
				}
				break
			}
			admitted++
			advance(now + 10_000)
		}
		if admitted != 5 {
			t.Errorf("%s: %d admitted before a refusal, want the limit 5", month, admitted)
		}
		advance(now + 500_000) // the gateway reports everything
		u := getUsage()
		b := u.Buckets[0]
		if b.Algorithm != "fixed_window" || b.Calendar["period"] != "month" || b.Calendar["utc_offset"] != "+05:30" {
			t.Errorf("%s: usage bucket %+v", month, b)
		}
		if got := (u.NowUs + b.ResetInMs*1000 + 999_999) / 1e6; got != lastReset {
			t.Errorf("%s: usage resets at %d (now %d + %d ms), the headers at %d", month, got, u.NowUs, b.ResetInMs, lastReset)
		}
		// Remaining counts the gateway's unused lease as taken: what it admitted plus
		// what it may still admit is the whole month's limit.
		if b.Remaining != 0 {
			t.Errorf("%s: usage remaining %d after the gateway admitted %d and was refused", month, b.Remaining, admitted)
		}
	}
	advance(now + 100_000)
	checkMonth("January", feb1, 0)
	advance(feb1 - 1)
	if s, _ := send(); s.Status() != 429 {
		t.Fatalf("1 µs before the boundary: %d, want 429", s.Status())
	}
	now = feb1
	if s, reset := send(); s.Status() != 200 || reset != mar1/1e6 {
		t.Fatalf("at the boundary: %s, want 200 resetting at %d", s.Header("x-ratelimit-reset"), mar1/1e6)
	}
	checkMonth("February", mar1, 1)
}

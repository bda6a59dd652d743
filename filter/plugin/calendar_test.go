package plugin_test

import (
	"fmt"
	"testing"
	"time"
)

// TestCalendarMonthBoundary: a monthly quota (fixed_window with a calendar) spent at the
// end of a month is refused until exactly 00:00 of the 1st at the rule's offset — still
// refused 1 µs before, admitted at the boundary — and every answer's reset headers
// (x-ratelimit-reset, the RateLimit t, Retry-After, the 429 body's reset_at) point at
// that boundary: January into February, and February into March in a common and a leap
// year, in UTC and at +05:30.
func TestCalendarMonthBoundary(t *testing.T) {
	for _, tc := range []struct {
		name, offset, label string
		from, to            time.Time // the month ending, the boundary
	}{
		{"jan_to_feb_utc", "+00:00", "plan-month", date(2027, 1, 31, 0), date(2027, 2, 1, 0)},
		{"feb_to_mar_common_year", "+00:00", "plan-month", date(2027, 2, 28, 0), date(2027, 3, 1, 0)},
		{"feb_to_mar_leap_year", "+00:00", "plan-month", date(2028, 2, 29, 0), date(2028, 3, 1, 0)},
		{"jan_to_feb_plus_0530", "+05:30", "plan-month+05:30", date(2027, 1, 31, 330), date(2027, 2, 1, 330)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGateway(t, `{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
				"rules":[{"id":"plan","algorithm":"fixed_window","limit":3,"calendar":{"period":"month","utc_offset":"`+tc.offset+`"}}]}`)
			boundary := tc.to.UnixMicro()
			_, m, _ := tc.from.Date()
			_, nm, _ := tc.to.AddDate(0, 1, 0).Date()
			next := time.Date(tc.to.Year(), nm, 1, 0, 0, 0, 0, tc.to.Location())
			if nm == time.January {
				next = next.AddDate(1, 0, 0)
			}
			ok := func(remaining int64, at, reset int64) string {
				return fmt.Sprintf(`200 | x-ratelimit-limit: 3 | x-ratelimit-remaining: %d | x-ratelimit-reset: %d | ratelimit-policy: "%s";q=3;w=2678400 | ratelimit: "%s";r=%d;t=%d`,
					remaining, reset/1e6, tc.label, tc.label, remaining, (reset-at+999_999)/1e6)
			}
			refused := func(at int64) string {
				secs := (boundary - at + 999_999) / 1e6
				return fmt.Sprintf(`429 | x-ratelimit-limit: 3 | x-ratelimit-remaining: 0 | x-ratelimit-reset: %d | ratelimit-policy: "%s";q=3;w=2678400 | ratelimit: "%s";r=0;t=%d | retry-after: %d | x-ratelimit-rule: plan | body {"error":{"code":"RATE_LIMIT_EXCEEDED","message":"Rate limit of 3 requests per month exceeded","details":{"limit":3,"window_seconds":2678400,"retry_after_seconds":%d,"reset_at":"%s","rule":"plan"}}}`,
					boundary/1e6, tc.label, tc.label, secs, secs, secs, time.UnixMicro(boundary).UTC().Format(time.RFC3339))
			}
			steps := []struct {
				at   int64
				want string
			}{
				// the last day of the month: spent
				{tc.from.Add(10 * time.Hour).UnixMicro(), ok(2, tc.from.Add(10*time.Hour).UnixMicro(), boundary)},
				{tc.from.Add(20 * time.Hour).UnixMicro(), ok(1, tc.from.Add(20*time.Hour).UnixMicro(), boundary)},
				{boundary - 90_000_000, ok(0, boundary-90_000_000, boundary)},
				{boundary - 60_000_000, refused(boundary - 60_000_000)},
				{boundary - 1, refused(boundary - 1)},
				// 00:00 on the 1st: a fresh month, resetting on the next 1st
				{boundary, ok(2, boundary, next.UnixMicro())},
			}
			for i, st := range steps {
				g.now = st.at
				if got := answer(g.send("/v1/x", "x-api-key: k1")); got != st.want {
					t.Errorf("request %d (%s, month %s):\n got %s\nwant %s", i, time.UnixMicro(st.at).UTC().Format(time.RFC3339Nano), m, got, st.want)
				}
			}
		})
	}
}

// date is midnight starting y-m-d at UTC+offMin.
func date(y int, m time.Month, d, offMin int) time.Time {
	return time.Date(y, m, d, 0, 0, 0, 0, time.FixedZone("", offMin*60))
}

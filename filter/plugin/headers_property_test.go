package plugin_test

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/internal/memservice"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/rule"
)

// Properties of the rate-limit headers over every algorithm, with and without a burst,
// on random request sequences (random gaps, bursts of back-to-back requests), on a
// gateway deciding alone and on one that syncs with the service (memservice: the
// service's lease logic without Redis), where answers come from leases, acquires and
// the service's replies:
//
//   - x-ratelimit-remaining is never above x-ratelimit-limit, and the ratelimit field's r
//     never above the q its policy advertises in ratelimit-policy;
//   - x-ratelimit-reset (when the bucket is full again, or the window ends) never moves
//     earlier while no permit is consumed: a refusal reports a reset no earlier than the
//     answer before it. Synced, this holds because the service's reset is that of the
//     charged state (outstanding leases taken at now would move it with every reply)
//     and reaches the gateway rounded down to the millisecond (a reset on a whole second
//     rounded up would cross into the next one, then step back on an exact reply).
//
// Calendar windows run too, with pauses of up to two periods: a gateway that uses a
// monthly quota again after weeks takes the service's answer (the 32-bit server time it
// compares replies by has wrapped), instead of showing last month's remaining.
//
// Each sequence is seeded, so a failure names a replayable case; 64 seeds pass, 8 run
// here to keep the suite short.
func TestHeaderProperties(t *testing.T) {
	// Calendar windows (fixed_window with a calendar): a day at +05:30, a week, and a
	// monthly quota whose per-permit pace is hours.
	for _, c := range []struct {
		name, calendar string
		limit, winMs   int64
	}{
		{"day_plus_0530", `{"period":"day","utc_offset":"+05:30"}`, 5, 86_400_000},
		{"week", `{"period":"week"}`, 20, 7 * 86_400_000},
		{"month_minus_0800", `{"period":"month","utc_offset":"-08:00"}`, 100, 31 * 86_400_000},
	} {
		t.Run("calendar/"+c.name, func(t *testing.T) {
			for _, sync := range []string{"", `"sync":{"cluster":"svc","interval_ms":100},`} {
				cfg := fmt.Sprintf(`{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,%s
					"rules":[{"id":"api","algorithm":"fixed_window","limit":%d,"calendar":%s}]}`, sync, c.limit, c.calendar)
				for seed := uint64(1); seed <= 8; seed++ {
					checkHeaderSequence(t, cfg, sync != "", c.limit, c.winMs*1000, seed)
				}
			}
		})
	}
	type limits struct {
		name                string
		limit, burst, winMs int64
	}
	shapes := []limits{
		{"5_per_1s", 5, 0, 1_000},
		{"100_per_1m", 100, 0, 60_000},
		{"20_per_1h", 20, 0, 3_600_000},
		{"3_per_10s", 3, 0, 10_000},
		{"100_per_1m_burst_120", 100, 120, 60_000},
		{"10_per_1s_burst_2", 10, 2, 1_000},
		{"1_per_1m_burst_50", 1, 50, 60_000},
	}
	for _, kind := range rule.Algorithms() {
		algorithm := kind.String()
		for _, sh := range shapes {
			burstful := kind.HasBurst()
			if sh.burst != 0 && !burstful {
				continue // the window algorithms have no burst (the parser refuses one)
			}
			t.Run(algorithm+"/"+sh.name, func(t *testing.T) {
				burst := ""
				if sh.burst != 0 {
					burst = `,"burst":` + strconv.FormatInt(sh.burst, 10)
				}
				for _, sync := range []string{"", `"sync":{"cluster":"svc","interval_ms":100},`} {
					cfg := fmt.Sprintf(`{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,%s
						"rules":[{"id":"api","algorithm":%q,"limit":%d,"window":"%dms"%s}]}`, sync, algorithm, sh.limit, sh.winMs, burst)
					for seed := uint64(1); seed <= 8; seed++ {
						checkHeaderSequence(t, cfg, sync != "", sh.limit, sh.winMs*1000, seed)
					}
				}
			})
		}
	}
}

// checkHeaderSequence runs 400 requests for one key with random gaps (seeded) and checks
// every answer's headers.
func checkHeaderSequence(t *testing.T, cfg string, synced bool, limit, windowUs int64, seed uint64) {
	t.Helper()
	g := newGateway(t, cfg)
	svc := memservice.New(lease.SyncConfig{})
	// deliver answers the gateway's callouts at once (answers can cause more).
	deliver := func() {
		for cs := g.h.TakeCallouts(); len(cs) > 0; cs = g.h.TakeCallouts() {
			for _, c := range cs {
				status, body := svc.Handle(c.Header(":path"), c.Body, g.now)
				g.h.Respond(c, [][2]string{{":status", strconv.Itoa(status)}}, body)
			}
		}
	}
	// advance moves the clock, firing the ticks (four per 100 ms interval) on the way;
	// of a long idle pause only the last 8 (an idle gateway's ticks change nothing).
	const tickUs = 25_000
	nextTick := g.now + tickUs
	advance := func(us int64) {
		if skip := (g.now + us - nextTick) / tickUs; synced && skip > 8 {
			nextTick += (skip - 8) * tickUs
		}
		for synced && g.now+us >= nextTick {
			us -= nextTick - g.now
			g.now = nextTick
			nextTick += tickUs
			g.h.Tick(0)
			deliver()
		}
		g.now += us
	}
	if synced {
		advance(100_000)
	}
	rng := rand.New(rand.NewPCG(seed, 0x7011))
	perPermit := max(windowUs/limit, 1)
	var prevReset int64
	var prev string
	for i := 0; i < 400; i++ {
		switch r := rng.IntN(10); {
		case r < 5: // back to back
		case r < 8: // about a permit's refill time
			advance(rng.Int64N(2*perPermit) + 1)
		case r < 9: // a long pause
			advance(rng.Int64N(2 * windowUs))
		default: // an odd microsecond, to land on rounding edges
			advance(rng.Int64N(1_000) + 1)
		}
		s := g.send("/v1/x", "x-api-key: k")
		deliver()
		if !s.Decided {
			t.Fatalf("seed %d, request %d: still paused after its callouts were answered", seed, i)
		}
		where := fmt.Sprintf("seed %d, request %d at +%d µs, synced %v (%d %s)", seed, i, g.now-t0, synced, s.Status(), answer(s))
		if st := s.Status(); st != 200 && st != 429 {
			t.Fatalf("%s: status %d", where, st)
		}
		lim, err1 := strconv.ParseInt(s.Header("x-ratelimit-limit"), 10, 64)
		rem, err2 := strconv.ParseInt(s.Header("x-ratelimit-remaining"), 10, 64)
		reset, err3 := strconv.ParseInt(s.Header("x-ratelimit-reset"), 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			t.Fatalf("%s: unreadable headers", where)
		}
		if rem < 0 || rem > lim {
			t.Fatalf("%s: x-ratelimit-remaining %d outside 0..x-ratelimit-limit %d", where, rem, lim)
		}
		q, r, ok := policyQuota(s.Header("ratelimit-policy"), s.Header("ratelimit"))
		if !ok {
			t.Fatalf("%s: unreadable ratelimit-policy / ratelimit", where)
		}
		if r > q || q != lim || r != rem {
			t.Fatalf("%s: ratelimit r=%d, policy q=%d, x-ratelimit-limit %d, x-ratelimit-remaining %d: want r = remaining ≤ q = limit", where, r, q, lim, rem)
		}
		if s.Status() == 429 && reset < prevReset {
			t.Fatalf("%s: a refusal (nothing consumed) moved x-ratelimit-reset earlier, from %d to %d (previous answer: %s)", where, prevReset, reset, prev)
		}
		prevReset, prev = reset, where
	}
}

// policyQuota reads the q of the policy the ratelimit field names, and that field's r.
func policyQuota(policy, field string) (q, r int64, ok bool) {
	name, params, found := strings.Cut(field, ";")
	if !found {
		return 0, 0, false
	}
	r, ok = sfParam(params, "r")
	if !ok {
		return 0, 0, false
	}
	for _, item := range strings.Split(policy, ", ") {
		n, p, _ := strings.Cut(item, ";")
		if n == name {
			q, ok = sfParam(p, "q")
			return q, r, ok
		}
	}
	return 0, 0, false
}

// sfParam reads an integer parameter from "a=1;b=2".
func sfParam(params, key string) (int64, bool) {
	for _, kv := range strings.Split(params, ";") {
		k, v, _ := strings.Cut(kv, "=")
		if k == key {
			n, err := strconv.ParseInt(v, 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

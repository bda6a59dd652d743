package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
)

// policyRules exercise the policy features: lists, a shadow rule, a strict fail-closed
// rule, and an ordinary rule for penalties and degraded mode.
const policyRules = `{
	"allow": ["sk_internal_*"],
	"deny":  ["sk_revoked_*"],
	"rules": [
		{"id":"api","match":{"prefix":"/api"},"limit":10,"window":"1m"},
		{"id":"preview","match":{"prefix":"/preview"},"limit":5,"window":"1m","shadow":true},
		{"id":"login","match":{"prefix":"/login"},"limit":5,"window":"1m","strict":true,"fail":"closed"}
	]}`

// errorBody is the JSON body of 403, 429 and 503 answers.
type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Details struct {
			Matched        string `json:"matched"`
			Rule           string `json:"rule"`
			RetryAfter     int    `json:"retry_after_seconds"`
			PenaltyLevel   int    `json:"penalty_level"`
			PenaltySeconds int    `json:"penalty_seconds"`
		} `json:"details"`
	} `json:"error"`
}

func decodeBody(t *testing.T, a *harness.Answer) errorBody {
	t.Helper()
	var b errorBody
	if err := json.Unmarshal(a.Body, &b); err != nil {
		t.Errorf("status %d body %q: %v", a.Status, a.Body, err)
	}
	return b
}

// TestPolicies is scenario 6: the deny list (403), the allow list (bypass), a shadow
// rule (reports, never refuses), progressive penalties for a client that ignores
// Retry-After (the cooldown in the 429 body grows), a strict rule decided by the service,
// and — with the service killed — the strict fail-closed rule answering 503 while
// ordinary rules keep deciding on their last-known buckets, marked degraded, and the
// failure metrics rise. The scenario runs its own service process (so it can kill it)
// with short penalty steps (200 ms doubling to 3.2 s) so the growth shows in seconds.
func TestPolicies(t *testing.T) {
	t.Parallel()
	e := sharedEnv(t)
	svc, err := harness.StartService(e.serviceConfig("--penalty-base", "200ms", "--penalty-max", "3200ms"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Stop)
	gw, err := harness.StartGateway(harness.GatewayConfig{
		Wasm: e.bins.Wasm, Workers: 2, NodeID: uniqueKey("policy-gw1"), Rules: []byte(policyRules), Pin: pinned,
		Services: []string{svc.Addr()}, Secret: syncSecret, Sync: harness.Sync{ExpectedNodes: 1}, Upstream: e.upstream.URL,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	ctx := ctxFor(t, 2*time.Minute)
	get := func(path, key string) harness.Answer { return e.client.Get(ctx, gw.URL, path, key) }
	run := func(path, key string, count int, rate float64) []harness.Answer {
		return e.client.Run(ctx, harness.Load{Gateways: []*harness.Gateway{gw}, Path: path, Key: key, Rate: rate, Count: count, Workers: 1})
	}

	t.Run("deny list", func(t *testing.T) {
		key := uniqueKey("sk_revoked_42") // matches sk_revoked_*, and only this run sends it
		a := get("/api/x", key)
		b := decodeBody(t, &a)
		logTable(t, "deny list", harness.KV("status", fmt.Sprint(a.Status), "code", b.Error.Code, "matched", b.Error.Details.Matched))
		if a.Status != http.StatusForbidden || b.Error.Code != "FORBIDDEN" || b.Error.Details.Matched != "sk_revoked_*" {
			t.Errorf("denied key: status %d, body %s", a.Status, a.Body)
		}
		if n := e.upstream.RequestsOf(key); n != 0 {
			t.Errorf("a denied request reached the upstream (%d)", n)
		}
	})

	t.Run("allow list", func(t *testing.T) {
		answers := run("/api/x", "sk_internal_ops", 50, 200)
		bypass := 0
		for i := range answers {
			if answers[i].Get("X-RateLimit-Policy") == "bypass" {
				bypass++
			}
		}
		logTable(t, "allow list: 50 requests on a 10/min rule", harness.KV("statuses", statusHistogram(answers), "marked bypass", fmt.Sprint(bypass)))
		if c := harness.Count(answers, 1); c.OK != 50 || bypass != 50 {
			t.Errorf("allow-listed key: %s, %d marked bypass; want 50 × 200 bypass", statusHistogram(answers), bypass)
		}
	})

	t.Run("shadow rule", func(t *testing.T) {
		before := gw.Metric("tollgate.requests_shadow_rejected")
		answers := run("/preview/x", uniqueKey("shadow"), 20, 200)
		flagged, firstFlagged := 0, -1
		for i := range answers {
			if answers[i].Get("X-RateLimit-Shadow") == "preview" {
				flagged++
				if firstFlagged < 0 {
					firstFlagged = i
				}
			}
		}
		metric := gw.Metric("tollgate.requests_shadow_rejected") - before
		logTable(t, "shadow rule: 20 requests on a 5/min shadow rule", harness.KV(
			"statuses", statusHistogram(answers), "flagged x-ratelimit-shadow", fmt.Sprint(flagged),
			"first flagged request #", fmt.Sprint(firstFlagged+1), "requests_shadow_rejected", fmt.Sprint(metric)))
		if c := harness.Count(answers, 1); c.OK != 20 {
			t.Errorf("a shadow rule refused requests: %s", statusHistogram(answers))
		}
		// 5 fit the bucket; refill adds one every 12 s, so 15 (14 at a refill) would be refused.
		if flagged < 14 || flagged > 15 || firstFlagged != 5 || metric != int64(flagged) {
			t.Errorf("shadow: %d flagged from request #%d, metric %d; want 15 from #6", flagged, firstFlagged+1, metric)
		}
	})

	t.Run("strict rule", func(t *testing.T) {
		answers := run("/login", uniqueKey("strict"), 8, 50)
		want := []int{200, 200, 200, 200, 200, 429, 429, 429}
		var got []int
		for i := range answers {
			got = append(got, answers[i].Status)
		}
		logTable(t, "strict rule (5/min, decided by the service): 8 requests", harness.KV(
			"statuses in order", fmt.Sprint(got), "strict_checks", fmt.Sprint(gw.Metric("tollgate.strict_checks"))))
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("strict rule statuses %v, want %v", got, want)
		}
		for i := range answers {
			if a := &answers[i]; a.Status == 429 && (a.RetryAfter() < 1 || a.Get("X-RateLimit-Rule") != "login") {
				t.Errorf("strict 429 #%d: Retry-After %q, rule %q", i+1, a.Get("Retry-After"), a.Get("X-RateLimit-Rule"))
			}
		}
	})

	// A key that used up its quota (without ignoring Retry-After): its local bucket must
	// keep refusing once the service is gone.
	quotaKey := uniqueKey("quota")
	t.Run("quota used up", func(t *testing.T) {
		start := time.Now()
		answers := run("/api/x", quotaKey, 11, 50)
		last := &answers[len(answers)-1]
		// The bucket was drained at start; it admits again 6 s later (10/min).
		wait := 6*time.Second - arrival(last).Sub(start)
		logTable(t, "quota used up: 11 requests on a 10/min rule", harness.KV(
			"statuses", statusHistogram(answers), "last Retry-After", last.Get("Retry-After"),
			"bucket admits again in", wait.Round(time.Millisecond).String()))
		if c := harness.Count(answers, 1); c.OK != 10 || c.Limited != 1 {
			t.Errorf("11 requests on a 10/min rule: %s", statusHistogram(answers))
		}
		// Retry-After is never earlier than the bucket can admit (RATIONALE.md §2).
		if last.Status == http.StatusTooManyRequests && time.Duration(last.RetryAfter())*time.Second < wait {
			t.Errorf("Retry-After %d s, but the bucket admits again only in %v", last.RetryAfter(), wait.Round(time.Millisecond))
		}
	})

	t.Run("progressive penalty", func(t *testing.T) {
		key := uniqueKey("greedy")
		type step struct {
			at                 time.Duration
			level, secs, retry int
			bucketWait         time.Duration
		}
		var steps []step
		var levels []int
		shortRetry := 0
		start := time.Now()
		// Ignore Retry-After: a request every 20 ms, until level 5 or a bounded 10 s.
		for time.Since(start) < 10*time.Second {
			time.Sleep(20 * time.Millisecond) // the client's pace
			a := get("/api/x", key)
			if a.Status == http.StatusTooManyRequests {
				// The body names the penalty only while a cooldown refuses the request; a
				// plain bucket refusal between cooldowns carries none.
				b := decodeBody(t, &a)
				lvl := b.Error.Details.PenaltyLevel
				if lvl == 0 {
					continue
				}
				levels = append(levels, lvl)
				// The first 10 requests (200 ms) drained the bucket; it admits again 6 s
				// after they started. A penalty adds to that wait, it never shortens it.
				bucketWait := 6*time.Second - arrival(&a).Sub(start)
				if time.Duration(a.RetryAfter())*time.Second < bucketWait {
					shortRetry++
				}
				if len(steps) == 0 || lvl != steps[len(steps)-1].level {
					steps = append(steps, step{time.Since(start), lvl, b.Error.Details.PenaltySeconds, a.RetryAfter(), bucketWait})
				}
				if lvl >= 5 {
					break
				}
			}
		}
		var rows [][]string
		for _, s := range steps {
			rows = append(rows, []string{s.at.Round(time.Millisecond).String(), fmt.Sprint(s.level), fmt.Sprint(s.secs), fmt.Sprint(s.retry),
				s.bucketWait.Round(time.Millisecond).String()})
		}
		logTable(t, "progressive penalty: a client ignoring Retry-After on a 10/min rule (first penalized 429 of each level)",
			harness.Table([]string{"since first request", "penalty_level", "penalty_seconds", "Retry-After", "bucket admits again in"}, rows))
		if shortRetry > 0 {
			t.Errorf("%d of %d penalized 429s said Retry-After shorter than the bucket's own wait (RATIONALE.md §2: never earlier than the bucket can admit)", shortRetry, len(levels))
		}
		top := 0
		for i, l := range levels {
			if i > 0 && l < levels[i-1] {
				t.Errorf("penalty level fell from %d to %d while the client kept ignoring Retry-After", levels[i-1], l)
				break
			}
			top = max(top, l)
		}
		if top < 5 {
			t.Errorf("penalty level reached only %d in %v", top, time.Since(start).Round(time.Millisecond))
		}
		if len(steps) > 0 && steps[len(steps)-1].secs <= steps[0].secs {
			t.Errorf("cooldown did not grow: %+v", steps)
		}
	})

	t.Run("service down", func(t *testing.T) {
		failedBefore := gw.Metric("tollgate.sync_failed")
		if err := svc.Kill(); err != nil {
			t.Fatal(err)
		}
		killAt := time.Now()
		// Strict fail-closed: 503 with Retry-After at once (the check's callout fails).
		login := get("/login", uniqueKey("strict-down"))
		lb := decodeBody(t, &login)
		// Ordinary rules: decided locally, degraded. A fresh key's request asks the
		// service (an acquire) and is decided degraded as soon as that fails; a key whose
		// answer the gateway can give from what it holds is marked degraded once the
		// gateway's sync has failed too (sync_failed rises) and every worker knows it
		// (breaker_state counts the workers that do) — the wait for the latter is what
		// the poll bounds.
		var open harness.Answer
		var fiveXX int
		var degradedAfter time.Duration
		openErr := harness.Poll(10*time.Second, 20*time.Millisecond, func() (bool, error) {
			open = get("/api/x", uniqueKey("open-down"))
			if open.Status >= 500 || open.Err != nil {
				fiveXX++
			}
			if open.Degraded() && degradedAfter == 0 {
				degradedAfter = time.Since(killAt)
			}
			return open.Degraded() && gw.Metric("tollgate.sync_failed") > failedBefore &&
				gw.Metric("tollgate.breaker_state") >= int64(gw.Host().Workers()), nil
		})
		quota := get("/api/x", quotaKey)
		failed := gw.Metric("tollgate.sync_failed") - failedBefore
		breaker := gw.Metric("tollgate.breaker_state")
		logTable(t, "service killed", harness.KV(
			"strict fail-closed rule", fmt.Sprintf("%d, Retry-After %s, code %s", login.Status, login.Get("Retry-After"), lb.Error.Code),
			"fail-open rule (fresh key)", fmt.Sprintf("%d, x-ratelimit-policy %q, remaining %s", open.Status, open.Get("X-RateLimit-Policy"), open.Get("X-RateLimit-Remaining")),
			"kill → first degraded answer", degradedAfter.Round(time.Millisecond).String(),
			"used-up key (local bucket)", fmt.Sprintf("%d, x-ratelimit-policy %q", quota.Status, quota.Get("X-RateLimit-Policy")),
			"sync_failed rise / breaker_state", fmt.Sprintf("%d / %d", failed, breaker),
			"answers_fail_closed", fmt.Sprint(gw.Metric("tollgate.answers_fail_closed")),
		))
		if login.Status != http.StatusServiceUnavailable || login.RetryAfter() < 1 || lb.Error.Code != "RATE_LIMITER_UNAVAILABLE" || lb.Error.Details.Rule != "login" {
			t.Errorf("strict fail-closed rule with the service down: %d %q %s", login.Status, login.Get("Retry-After"), login.Body)
		}
		if openErr != nil || open.Status != http.StatusOK || open.Get("X-RateLimit-Remaining") != "-1" {
			t.Errorf("fail-open rule with the service down: %d, policy %q, remaining %q (%v)", open.Status, open.Get("X-RateLimit-Policy"), open.Get("X-RateLimit-Remaining"), openErr)
		}
		if fiveXX > 0 {
			t.Errorf("%d fail-open requests failed while the service was down", fiveXX)
		}
		if quota.Status != http.StatusTooManyRequests || !quota.Degraded() {
			t.Errorf("used-up key with the service down: %d, policy %q; want a degraded 429 from the last-known bucket", quota.Status, quota.Get("X-RateLimit-Policy"))
		}
		if failed == 0 || breaker == 0 || gw.Metric("tollgate.answers_fail_closed") == 0 {
			t.Errorf("alert metrics: sync_failed +%d, breaker_state %d, answers_fail_closed %d", failed, breaker, gw.Metric("tollgate.answers_fail_closed"))
		}
	})
}

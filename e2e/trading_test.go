package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
)

// TestTradingBot is scenario 1: a bot fires 500 requests within one second at a key
// limited to 100 per minute, through one gateway with two workers. Exactly the bucket's
// capacity is admitted, plus what refills while the burst lasts (100/min × its
// duration); every other answer is a 429 with Retry-After, and every answer carries the
// rate-limit headers. The upstream sees only the admitted requests, and Redis has
// charged exactly that many.
func TestTradingBot(t *testing.T) {
	// One at a time (not t.Parallel): it counts exact quotas over a second or less
	// through the shared services, which the parallel scenarios keep busy.
	e := sharedEnv(t)
	const (
		limit    = 100
		requests = 500
	)
	rules := `{"rules":[{"id":"bot","match":{"prefix":"/trade"},"limit":100,"window":"1m"}]}`
	gws := e.fleet(t, uniqueKey("bot"), 1, rules, true, harness.Sync{})
	key := uniqueKey("bot")

	start := time.Now()
	answers := e.client.Run(ctxFor(t, time.Minute), harness.Load{
		Gateways: gws, Path: "/trade/orders", Key: key, Rate: requests, Count: requests, Workers: 16,
	})
	var last time.Time
	for i := range answers {
		if end := answers[i].Sent.Add(answers[i].Latency); end.After(last) {
			last = end
		}
	}
	elapsed := last.Sub(start)
	tally := harness.Count(answers, 1)
	// Refill during the burst: 100/min over the time from the first request to the last
	// answer. A full bucket holds no fraction of a permit, so a token bucket admits at
	// most floor(refill) more than its capacity.
	refill := float64(limit) * elapsed.Seconds() / 60
	maxAdmitted := limit + int(math.Floor(refill))

	var noHeaders, badRetry, badBody, notLimited, firstLimited int
	firstLimited = -1
	retryMin, retryMax := math.MaxInt, 0
	for i := range answers {
		a := &answers[i]
		if !a.LimitHeaders() || a.Degraded() || a.Get("X-RateLimit-Limit") != "100" {
			noHeaders++
		}
		switch a.Status {
		case http.StatusOK:
		case http.StatusTooManyRequests:
			if firstLimited < 0 {
				firstLimited = i
			}
			ra := a.RetryAfter()
			if ra < 1 {
				badRetry++
			}
			retryMin, retryMax = min(retryMin, ra), max(retryMax, ra)
			var body struct {
				Error struct {
					Code    string `json:"code"`
					Details struct {
						Limit int    `json:"limit"`
						Rule  string `json:"rule"`
					} `json:"details"`
				} `json:"error"`
			}
			if json.Unmarshal(a.Body, &body) != nil || body.Error.Code != "RATE_LIMIT_EXCEEDED" ||
				body.Error.Details.Rule != "bot" || body.Error.Details.Limit != limit || a.Get("X-RateLimit-Rule") != "bot" {
				badBody++
			}
		default:
			notLimited++
		}
	}

	// Redis must have charged what was admitted, once every worker has flushed.
	admin := e.admin()
	var consumed float64
	err := harness.Poll(5*time.Second, 50*time.Millisecond, func() (bool, error) {
		b, now, err := admin.Bucket(key, "bot", 0)
		if err != nil || b == nil {
			return false, err
		}
		consumed = tokenBucketConsumed(b, now, start)
		return math.Abs(consumed-float64(tally.OK)) <= 1, nil
	})
	upstream := e.upstream.RequestsOf(key)

	logTable(t, "scenario 1: trading bot, 500 requests in ~1 s vs 100/min, one gateway (2 workers)", harness.KV(
		"requests sent", fmt.Sprint(tally.Total),
		"burst duration (first send to last answer)", elapsed.Round(time.Millisecond).String(),
		"statuses", statusHistogram(answers),
		"admitted", fmt.Sprint(tally.OK),
		"allowed range [capacity, capacity+floor(refill)]", fmt.Sprintf("[%d, %d] (refill %.2f)", limit, maxAdmitted, refill),
		"first 429 at request #", fmt.Sprint(firstLimited+1),
		"Retry-After range (s)", fmt.Sprintf("%d..%d", retryMin, retryMax),
		"answers missing rate-limit headers", fmt.Sprint(noHeaders),
		"upstream requests", fmt.Sprint(upstream),
		"Redis consumed (token bucket state)", fmt.Sprintf("%.1f", consumed),
		"p50/p99 latency", latencies(answers),
	))

	if tally.Failed > 0 || notLimited > 0 {
		t.Errorf("%d transport failures and %d answers other than 200/429 (%s)", tally.Failed, notLimited, statusHistogram(answers))
	}
	if tally.OK < limit || tally.OK > maxAdmitted {
		t.Errorf("admitted %d, want %d..%d (capacity plus refill over %v)", tally.OK, limit, maxAdmitted, elapsed)
	}
	if tally.OK+tally.Limited != requests {
		t.Errorf("admitted %d + limited %d != %d sent", tally.OK, tally.Limited, requests)
	}
	if noHeaders > 0 {
		t.Errorf("%d answers without the full, non-degraded rate-limit headers (limit 100)", noHeaders)
	}
	if badRetry > 0 || badBody > 0 {
		t.Errorf("429s: %d without a Retry-After >= 1 s, %d with a wrong body or x-ratelimit-rule", badRetry, badBody)
	}
	if upstream != int64(tally.OK) {
		t.Errorf("upstream saw %d requests, %d were admitted", upstream, tally.OK)
	}
	if err != nil {
		t.Errorf("Redis charged %.1f permits, %d were admitted: %v", consumed, tally.OK, err)
	}
}

// latencies renders the median and 99th percentile latency.
func latencies(answers []harness.Answer) string {
	if len(answers) == 0 {
		return "-"
	}
	d := make([]time.Duration, len(answers))
	for i := range answers {
		d[i] = answers[i].Latency
	}
	sortDurations(d)
	p := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
	return fmt.Sprintf("%v / %v", p(0.5).Round(10*time.Microsecond), p(0.99).Round(10*time.Microsecond))
}

func sortDurations(d []time.Duration) {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
}

// TestSteadyClientOverLimit is scenario 1's slow twin: a client that sends one request
// every 1.25 s — slower than the sync interval and than the gateway reports an unused
// lease, faster than its limit of 3 per minute — through one gateway. Over 8 requests
// (~9 s) the bucket allows its capacity of 3 (the refill over 9 s is under one permit):
// exactly that is admitted, whatever the pauses between requests. (With a
// sync.lease_ttl_ms shorter than the client's pauses the third request is refused: see
// e2e/README.md, "Still open".)
func TestSteadyClientOverLimit(t *testing.T) {
	t.Parallel()
	e := sharedEnv(t)
	const (
		limit    = 3
		requests = 8
		gap      = 1250 * time.Millisecond
	)
	rules := `{"rules":[{"id":"steady","match":{"prefix":"/steady"},"limit":3,"window":"1m"}]}`
	gws := e.fleet(t, uniqueKey("steady"), 1, rules, true, harness.Sync{})
	key := uniqueKey("steady")
	ctx := ctxFor(t, time.Minute)
	start := time.Now()
	answers := e.client.Run(ctx, harness.Load{Gateways: gws, Path: "/steady", Key: key, Rate: float64(time.Second) / float64(gap), Count: requests, Workers: 1})
	elapsed := lastAnswer(answers).Sub(start)
	maxAdmitted := limit + int(math.Floor(float64(limit)*elapsed.Seconds()/60))
	tally := harness.Count(answers, 1)
	var rows [][]string
	for i := range answers {
		a := &answers[i]
		rows = append(rows, []string{fmt.Sprint(i + 1), a.Sent.Sub(start).Round(time.Millisecond).String(), fmt.Sprint(a.Status),
			a.Get("X-RateLimit-Remaining"), a.Get("Retry-After")})
	}
	remaining := "-"
	if b, _, err := e.admin().Bucket(key, "steady", 0); err == nil && b != nil {
		remaining = fmt.Sprint(b.Remaining)
	}
	logTable(t, fmt.Sprintf("steady client: one request every %v on %d/min, one gateway", gap, limit),
		harness.Table([]string{"#", "sent at", "status", "X-RateLimit-Remaining", "Retry-After"}, rows))
	t.Logf("admitted %d of %d over %v, allowance %d; Redis remaining %s", tally.OK, requests, elapsed.Round(time.Millisecond), maxAdmitted, remaining)
	if tally.OK > maxAdmitted {
		t.Errorf("admitted %d requests, the bucket allows %d over %v: a gateway whose lease expired between "+
			"requests restarts the bucket cold (full) each time", tally.OK, maxAdmitted, elapsed.Round(time.Millisecond))
	}
	if tally.OK < limit {
		t.Errorf("admitted %d, want at least the capacity %d", tally.OK, limit)
	}
}

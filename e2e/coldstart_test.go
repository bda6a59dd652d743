package e2e

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
)

// TestColdStartBurst: one fresh key hit at 10x its limit on every worker of four
// gateways at the same instant, 20 times (a new key each run), on the Redis Cluster
// with the shipped envoy.yaml configuration. Every gateway meets the key cold, which is
// where a lease protocol over-admits: each may admit a cold slice before the service
// has heard from the others (RATIONALE.md §2, "cold start"; the slice's reservation is
// what keeps simultaneous cold starts within the capacity). Every run must admit at
// most the bucket's allowance (capacity plus the refill over the run) + 5 %, and — a
// limiter that starves a fresh key is broken too — at least 90 % of the capacity.
// It runs on every host: 20 runs on the wazero host, 8 on each Envoy (20 with
// TOLLGATE_E2E_FULL=1).
func TestColdStartBurst(t *testing.T) {
	forHosts(t, harness.Hosts(), testColdStartBurst)
}

func testColdStartBurst(t *testing.T, host string) {
	e := sharedEnv(t)
	runs := 20
	if onEnvoy(host) && !fullLength() {
		runs = 8
	}
	const (
		limit     = 100 // the shipped "plan" rule's free tier: 100/min, capacity 100
		requests  = 10 * limit
		perWorker = 4 // concurrent connections on each worker
		overBound = 0.05
	)
	gws := e.shippedFleet(t, host, uniqueKey("cold"), 4)
	type lane struct {
		gw     int
		client *harness.Client
	}
	var lanes []lane
	for i, g := range gws {
		for w := 0; w < g.Workers(); w++ {
			c := g.WorkerClient(w)
			t.Cleanup(c.Close)
			for k := 0; k < perWorker; k++ {
				lanes = append(lanes, lane{i, c})
			}
		}
	}
	ctx := ctxFor(t, 3*time.Minute)

	var rows [][]string
	var failures []string
	worstOver := -1.0
	for run := 1; run <= runs; run++ {
		key := uniqueKey(fmt.Sprintf("cold%d", run))
		start := make(chan struct{})
		answers := make([][]harness.Answer, len(lanes))
		var wg sync.WaitGroup
		for l := range lanes {
			n := requests / len(lanes)
			if l < requests%len(lanes) {
				n++
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for i := 0; i < n; i++ {
					a := lanes[l].client.Get(ctx, gws[lanes[l].gw].URL, "/orders", key)
					a.Gateway = lanes[l].gw
					answers[l] = append(answers[l], a)
				}
			}()
		}
		t0 := time.Now()
		close(start)
		wg.Wait()
		var all []harness.Answer
		for _, a := range answers {
			all = append(all, a...)
		}
		tally := harness.Count(all, len(gws))
		span := lastAnswer(all).Sub(t0)
		allowance := float64(limit) * (1 + span.Seconds()/60) // capacity + refill over the run
		bound := allowance * (1 + overBound)
		over := (float64(tally.OK) - allowance) / allowance
		worstOver = max(worstOver, over)
		var perGW []string
		for i := range gws {
			perGW = append(perGW, fmt.Sprint(tally.PerGateway[i].OK))
		}
		rows = append(rows, []string{fmt.Sprint(run), fmt.Sprint(tally.OK), fmt.Sprintf("%.1f", allowance),
			fmt.Sprintf("%+.1f%%", 100*over), fmt.Sprint(perGW), span.Round(time.Millisecond).String(), statusHistogram(all)})
		switch {
		case float64(tally.OK) > bound:
			failures = append(failures, fmt.Sprintf("run %d: %d admitted, bound %.1f (allowance %.1f + 5 %%)", run, tally.OK, bound, allowance))
		case tally.OK < limit*9/10:
			failures = append(failures, fmt.Sprintf("run %d: only %d admitted of a capacity of %d", run, tally.OK, limit))
		}
		if tally.OK+tally.Limited != requests || tally.Degraded > 0 {
			failures = append(failures, fmt.Sprintf("run %d: %s, %d degraded: every answer must be a non-degraded 200 or 429", run, statusHistogram(all), tally.Degraded))
		}
		if n := missingHeaders(all); n > 0 {
			failures = append(failures, fmt.Sprintf("run %d: %d answers without the rate-limit headers", run, n))
		}
		for i := range all {
			if all[i].Status == http.StatusOK && all[i].Get("X-RateLimit-Limit") != fmt.Sprint(limit) {
				failures = append(failures, fmt.Sprintf("run %d: an answer advertises limit %q, want %d (the shipped free tier)", run, all[i].Get("X-RateLimit-Limit"), limit))
				break
			}
		}
	}
	logTable(t, fmt.Sprintf("cold start on %s: a fresh key, %d requests at once over 4 gateways × 2 workers × %d connections (shipped envoy.yaml, free tier %d/min)", host, requests, perWorker, limit),
		harness.Table([]string{"run", "admitted", "allowance", "over", "per gateway", "span", "statuses"}, rows))
	t.Logf("worst over-admission %+.2f%% (bound +%.0f%%)", 100*worstOver, 100*overBound)
	for _, f := range failures {
		t.Error(f)
	}
}

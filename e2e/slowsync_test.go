package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
	"github.com/tollgate-rl/tollgate/internal/redistest"
)

// TestSlowSyncIsNotDegraded: a Redis that holds writes for 200 ms but answers everything
// else (CLIENT PAUSE WRITE, as Redis itself does during a failover) makes the sync round
// trips of that moment that slow, within the callout's timeout (250 ms), while the
// service answers what needs no write (a caller above its limit on another rule keeps a
// delta in every batch: a heartbeat alone writes nothing), its liveness probe included
// (a PING). A gateway (2 workers, the shipped sync settings) probes the service while
// its sync waits, so it keeps answering from its leases, healthy: in 10 stalls, no
// degraded answer unless a sync or an acquire failed or timed out meanwhile (on a loaded
// machine a stalled round trip can pass the timeout). The filter that counted an
// unanswered sync of 125 ms as down answered degraded in all 10. A Redis that answers
// nothing (CLIENT PAUSE ALL) for 4 s is an outage of the service's Redis: the service
// answers its liveness probe 503, and the gateway answers degraded within two sync
// intervals (RATIONALE.md §3 "Slow is not down"); it is healthy again once Redis answers.
func TestSlowSyncIsNotDegraded(t *testing.T) {
	t.Parallel()
	e := sharedEnv(t)
	rds, err := redistest.Launch(redistest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rds.Stop)
	svc, err := harness.StartService(harness.ServiceConfig{Bin: e.bins.Service, RedisAddrs: rds.Addrs(),
		AdminToken: adminToken, SyncSecret: syncSecret, Args: sharedServiceArgs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Stop)
	gw, err := harness.StartGateway(harness.GatewayConfig{
		Wasm: e.bins.Wasm, Workers: 2, NodeID: uniqueKey("slowsync"),
		Rules: []byte(`{"rules":[{"id":"deg","match":{"prefix":"/deg"},"limit":1000000,"window":"1m"},
			{"id":"hot","match":{"prefix":"/hot"},"limit":5,"window":"1s"}]}`),
		Pin: pinned, Services: []string{svc.Addr()}, Secret: syncSecret, Upstream: e.upstream.URL,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	rc := redis.NewClient(&redis.Options{Addr: rds.Addr()})
	t.Cleanup(func() { _ = rc.Close() })

	ctx, cancel := context.WithCancel(ctxFor(t, 3*time.Minute))
	probes := make([]*workerProbe, gw.Host().Workers())
	var wg sync.WaitGroup
	for w := range probes {
		probes[w] = &workerProbe{}
		c := gw.WorkerClient(w)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			probes[w].run(ctx, c, gw.URL, uniqueKey("slowsync"))
		}()
	}
	// A caller above its limit on another rule: its refusals put its bucket in every
	// batch, so each sync has work for Redis (a heartbeat alone does not touch it).
	wg.Add(1)
	go func() {
		defer wg.Done()
		key := uniqueKey("slowsync-hot")
		for ctx.Err() == nil {
			e.client.Get(ctx, gw.URL, "/hot", key)
			time.Sleep(10 * time.Millisecond)
		}
	}()
	stopProbes := sync.OnceFunc(func() { cancel(); wg.Wait() })
	defer stopProbes()
	healthy := func() (bool, error) {
		for _, p := range probes {
			p.mu.Lock()
			since := p.okSince
			p.mu.Unlock()
			if since.IsZero() || time.Since(since) < 300*time.Millisecond {
				return false, nil
			}
		}
		return true, nil
	}
	arm := func(at time.Time) {
		for _, p := range probes {
			p.mu.Lock()
			p.armedAt, p.firstDegraded = at, time.Time{}
			p.mu.Unlock()
		}
	}
	// firstDegraded is the earliest first degraded answer of a worker since arm (zero:
	// none), and how many workers answered degraded.
	firstDegraded := func() (first time.Time, workers int) {
		for _, p := range probes {
			p.mu.Lock()
			d := p.firstDegraded
			p.mu.Unlock()
			if !d.IsZero() {
				workers++
				if first.IsZero() || d.Before(first) {
					first = d
				}
			}
		}
		return first, workers
	}
	pause := func(d time.Duration, mode string) {
		if err := rc.Do(ctx, "CLIENT", "PAUSE", d.Milliseconds(), mode).Err(); err != nil {
			t.Fatalf("CLIENT PAUSE: %v", err)
		}
	}

	const stalls = 10
	var rows [][]string
	degradedStalls := 0
	for i := 1; i <= stalls; i++ {
		if err := harness.Poll(15*time.Second, 5*time.Millisecond, healthy); err != nil {
			t.Fatalf("stall %d: the gateway did not answer healthy on every worker: %v", i, err)
		}
		at := time.Now()
		arm(at)
		failed0, checks0, acq0 := gw.Metric("tollgate.sync_failed"), gw.Metric("tollgate.checks_failed"), gw.Metric("tollgate.acquires")
		pause(200*time.Millisecond, "WRITE")
		time.Sleep(600 * time.Millisecond)
		first, workers := firstDegraded()
		arm(time.Time{})
		syncsFailed, checksFailed := gw.Metric("tollgate.sync_failed")-failed0, gw.Metric("tollgate.checks_failed")-checks0
		row := []string{fmt.Sprint(i), "none", fmt.Sprint(syncsFailed),
			fmt.Sprintf("%d / %d", gw.Metric("tollgate.acquires")-acq0, checksFailed)}
		if workers > 0 {
			row[1] = fmt.Sprintf("%d workers, first %v after the stall began", workers, first.Sub(at).Round(time.Millisecond))
			if syncsFailed == 0 && checksFailed == 0 {
				degradedStalls++ // degraded with nothing failed: what must not happen
			}
		}
		rows = append(rows, row)
	}
	logTable(t, "Redis writes held 200 ms (CLIENT PAUSE WRITE): degraded answers", harness.Table([]string{"stall", "degraded", "syncs failed", "acquires / failed"}, rows))
	if degradedStalls > 0 {
		t.Errorf("in %d of %d stalls of 200 ms the gateway answered degraded with no sync or acquire failed or timed out", degradedStalls, stalls)
	}

	// An outage of Redis: nothing answered, the liveness probe included.
	const outage = 4 * time.Second
	if err := harness.Poll(15*time.Second, 5*time.Millisecond, healthy); err != nil {
		t.Fatalf("before the outage: the gateway did not answer healthy on every worker: %v", err)
	}
	at := time.Now()
	arm(at)
	pause(outage, "ALL")
	err = harness.Poll(outage, 5*time.Millisecond, func() (bool, error) {
		_, workers := firstDegraded()
		return workers == len(probes), nil
	})
	first, workers := firstDegraded()
	arm(time.Time{})
	if err != nil {
		t.Fatalf("Redis stalled %v: %d of %d workers answered degraded within it (the liveness probe answers 503)", outage, workers, len(probes))
	}
	t.Logf("Redis stalled %v: every worker answered degraded, the first %v after the stall began", outage, first.Sub(at).Round(time.Millisecond))
	if err := harness.Poll(15*time.Second, 5*time.Millisecond, healthy); err != nil {
		t.Fatalf("after the outage: the gateway did not answer healthy again: %v", err)
	}
	stopProbes()
	var sent, failed int
	for _, p := range probes {
		sent, failed = sent+p.sent, failed+p.failed
	}
	if failed > 0 {
		t.Errorf("%d of %d requests on a fail-open rule were not answered 200", failed, sent)
	}
}

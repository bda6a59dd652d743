package e2e

import (
	"sync"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
)

// TestRulesRolloutLosesNothing: while two gateways carry load on two rules, an operator
// raises one rule's limit and deletes the other. Gateways still on the previous version
// keep reporting under the surviving rule's id, and the service charges those reports
// to the rule's state under its current parameters, so Redis ends up counting every
// permit admitted before and after the change, and the fleet's total on the surviving
// rule stays within its new limit plus the fleet bound (RATIONALE §3: the refill between
// a grant and its use; none here, the window is an hour). A sliding log counts exactly,
// with no window boundary to cross during the run.
func TestRulesRolloutLosesNothing(t *testing.T) {
	t.Parallel()
	e := sharedEnv(t)
	admin, gws := ownService(t, e, "rollout")
	const (
		before = `{"rules":[` +
			`{"id":"keep","match":{"prefix":"/keep"},"algorithm":"sliding_window_log","limit":300,"window":"1h"},` +
			`{"id":"gone","match":{"prefix":"/gone"},"algorithm":"sliding_window_log","limit":300,"window":"1h"}]}`
		after = `{"rules":[` +
			`{"id":"keep","match":{"prefix":"/keep"},"algorithm":"sliding_window_log","limit":400,"window":"1h"}]}`
		newLimit   = 400
		fleetBound = 2
	)
	v1, err := admin.PutRules([]byte(before))
	if err != nil {
		t.Fatal(err)
	}
	onVersion(t, gws, v1, "/keep/probe")
	onVersion(t, gws, v1, "/gone/probe")

	ctx := ctxFor(t, 2*time.Minute)
	hd := hostDelay(t)
	key := uniqueKey("rollout")
	var keep, gone []harness.Answer
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		keep = e.client.Run(ctx, harness.Load{Gateways: gws, Path: "/keep/x", Key: key, Rate: 150, Count: 750, Workers: 8})
	}()
	go func() {
		defer wg.Done()
		gone = e.client.Run(ctx, harness.Load{Gateways: gws, Path: "/gone/x", Key: key, Rate: 100, Count: 400, Workers: 4})
	}()
	// The change lands while both rules are in use: about 225 of the 300 spent.
	time.Sleep(1500 * time.Millisecond)
	v2, err := admin.PutRules([]byte(after))
	if err != nil {
		t.Fatal(err)
	}
	changedAt := time.Now()
	wg.Wait()

	kt, gt := harness.Count(keep, len(gws)), harness.Count(gone, len(gws))
	var okBefore int
	for i := range keep {
		if keep[i].Status == 200 && keep[i].Sent.Before(changedAt) {
			okBefore++
		}
	}
	t.Logf("keep: %d admitted (%d before the change), %d limited, %d degraded; gone: %d admitted, %d limited",
		kt.OK, okBefore, kt.Limited, kt.Degraded, gt.OK, gt.Limited)
	if kt.Failed != 0 || kt.Unavailable != 0 || kt.OtherStatus != 0 {
		t.Fatalf("keep: answers other than 200 and 429: %s", statusHistogram(keep))
	}
	if okBefore == 0 || okBefore >= kt.OK {
		t.Fatalf("the change did not land during the load (%d of %d admitted before it)", okBefore, kt.OK)
	}
	if kt.OK > newLimit+fleetBound {
		t.Errorf("keep: %d admitted over the rollout, more than the new limit %d plus the fleet bound %d", kt.OK, newLimit, fleetBound)
	}
	// A degraded answer was decided on its gateway's own state while it counted the
	// service unreachable. Without degraded answers the fleet admits at least the new
	// limit less the fleet bound and Redis counts exactly what was admitted. Beside a
	// build loop one run had 6 degraded answers after host stalls: 391 admitted, and 392
	// counted (an acquire the service took after its gateway stopped waiting). Such a
	// run, every degraded episode following a stall of this host (degradedEpisodes),
	// keeps only the bounds a stall cannot excuse: no more than the limit plus the fleet
	// bound, and nothing admitted left uncounted; a degraded answer without a stall
	// fails the test.
	unexplained, episodes := degradedEpisodes(hd, keep, gone)
	if kt.Degraded+gt.Degraded > 0 {
		t.Logf("degraded answers: %s", episodes)
	}
	if unexplained > 0 {
		t.Errorf("%d degraded answers without a host stall before them: %s", unexplained, episodes)
	}
	exact := kt.Degraded+gt.Degraded == 0
	if exact && kt.OK < newLimit-fleetBound {
		t.Errorf("keep: only %d admitted although 750 were sent against a limit of %d", kt.OK, newLimit)
	}
	// Every admitted permit, before the change and after, is counted in Redis under the
	// surviving rule once the gateways have reported (consumption out of a lease when
	// the lease is renewed or ends, up to two 20 s epochs).
	var used int64
	if err := harness.Poll(60*time.Second, 100*time.Millisecond, func() (bool, error) {
		b, _, err := admin.Bucket(key, "keep", 0)
		if err != nil {
			return false, nil
		}
		used = b.Limit - b.Available
		return b.Limit == newLimit && (used == int64(kt.OK) || !exact && used > int64(kt.OK)), nil
	}); err != nil {
		t.Fatalf("Redis counts %d of the %d permits admitted on the surviving rule: %v", used, kt.OK, err)
	}
	for _, g := range gws {
		if got := g.Metric("tollgate.rules_version"); got != int64(v2) {
			t.Errorf("%s: rules_version %d, want %d", g.Name, got, v2)
		}
	}
}

// TestRefusedSyncRecovers: the service starts refusing a gateway's batches (its sync
// secret rotated without the gateways' — every batch answered 401), so the gateways
// decide alone and say so; once the secret is put back, every gateway is back to
// answers without the degraded marker within a second (their syncs keep going while
// refused, so the first accepted one closes the breaker).
func TestRefusedSyncRecovers(t *testing.T) {
	t.Parallel()
	e := sharedEnv(t)
	admin, gws, svc := ownServiceProcess(t, e, "refused")
	v, err := admin.PutRules([]byte(`{"rules":[{"id":"api","match":{"prefix":"/api"},"limit":100000,"window":"1m"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	onVersion(t, gws, v, "/api/probe")
	ctx := ctxFor(t, time.Minute)
	key := uniqueKey("refused")
	// degraded asks every worker of every gateway once and counts the answers that
	// carry the degraded marker.
	workers := 0
	for _, g := range gws {
		workers += g.Host().Workers()
	}
	degraded := func() (int, error) {
		n := 0
		for _, g := range gws {
			for w := 0; w < g.Host().Workers(); w++ {
				c := g.WorkerClient(w)
				a := c.Get(ctx, g.URL, "/api/x", key)
				c.Close()
				if a.Err != nil {
					return 0, a.Err
				}
				if a.Degraded() {
					n++
				}
			}
		}
		return n, nil
	}

	if err := svc.SetSyncSecrets("rotated-without-the-gateways"); err != nil {
		t.Fatal(err)
	}
	if err := harness.Poll(15*time.Second, 20*time.Millisecond, func() (bool, error) {
		n, err := degraded()
		return n == workers, err
	}); err != nil {
		t.Fatalf("not every worker answers degraded while the service refuses every batch: %v", err)
	}
	// Refused for a while: long enough for the breaker's backoff to reach its ceiling.
	time.Sleep(6 * time.Second)
	if n, err := degraded(); err != nil || n != workers {
		t.Fatalf("%d of %d workers degraded while still refused (%v)", n, workers, err)
	}
	dropped := sumMetric(gws, "tollgate.sync_batches_dropped")
	if dropped == 0 {
		t.Fatal("the refused batches are not counted (tollgate.sync_batches_dropped)")
	}

	if err := svc.SetSyncSecrets(syncSecret); err != nil {
		t.Fatal(err)
	}
	hd := hostDelay(t)
	fixed := time.Now()
	if err := pollWithin(hd, time.Second, 10*time.Millisecond, func() (bool, error) {
		n, err := degraded()
		return n == 0 && err == nil, nil
	}); err != nil {
		t.Fatalf("still degraded after the service accepts batches again (%d batches refused meanwhile): %v", dropped, err)
	}
	t.Logf("every worker answers without the degraded marker %v after the fix (%d batches refused meanwhile)",
		time.Since(fixed).Round(time.Millisecond), dropped)
}

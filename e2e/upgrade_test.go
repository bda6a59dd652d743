package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
)

// lastV1Commit is the last commit whose filter speaks wire Version 1 (one batch per
// worker, no lease epochs): the gateway of the release before the lease protocol of
// RATIONALE.md §2.
const lastV1Commit = "c8e7beb0d6669b12dcd429d6183ea4481959de16"

// TestRollingUpgrade is a rolling upgrade caught in the middle: the service is new, one
// gateway still runs the previous release's filter (built from lastV1Commit, speaking
// wire Version 1) and one runs the current filter (Version 2), both with the same rules
// and the same callers. The service answers each in its own version
// (ratelimit/README.md, "Upgrades"). Both must keep syncing (no failed sync the host's
// own stalls do not explain, no degraded answer, both in the service's fleet record),
// both must charge the same buckets (Redis counts exactly what the two admitted on the
// accounting key), and the hot key's limit must still hold over both gateways.
func TestRollingUpgrade(t *testing.T) {
	t.Parallel()
	e := sharedEnv(t)
	const (
		hotLimit, hotBurst = 600, 100
		duration           = 10 * time.Second
		// The old gateway gets no lease from the new service and decides from its share
		// of the remaining the replies report: over-admission bounded loosely, the point
		// is that both versions enforce one limit.
		overBound = 0.10
	)
	oldWasm, err := harness.BuildFilterAt(lastV1Commit)
	if err != nil {
		t.Fatalf("build the previous release's filter: %v", err)
	}
	name := uniqueKey("upgrade")
	var gws []*harness.Gateway
	for _, g := range []struct {
		node string
		wasm []byte
	}{{name + "-v1", oldWasm}, {name + "-v2", e.bins.Wasm}} {
		gw, err := harness.StartGateway(harness.GatewayConfig{
			Wasm: g.wasm, Workers: 2, NodeID: g.node, Rules: []byte(failoverRules), Pin: pinned,
			Services: e.serviceAddrs(), Secret: syncSecret, Sync: harness.Sync{ExpectedNodes: 2}, Upstream: e.upstream.URL,
		})
		if err != nil {
			t.Fatalf("gateway %s: %v", g.node, err)
		}
		t.Cleanup(gw.Close)
		gws = append(gws, gw)
	}
	hotKey := uniqueKey("up-hot")
	acctKey := hotKey + "-acct"

	ctx := ctxFor(t, 2*time.Minute)
	hd := hostDelay(t)
	stop := make(chan struct{})
	runStart := time.Now()
	tr := startTraffic(ctx, e, gws, hotKey, acctKey, stop)
	time.Sleep(duration) // load duration
	close(stop)
	tr.wg.Wait()
	seen, seenErr := e.nodesLastSeen(ctx)

	n := len(gws)
	ht, at := harness.Count(tr.hot, n), harness.Count(tr.acct, n)
	span := lastAnswer(tr.hot).Sub(runStart)
	allowance := float64(hotBurst) + float64(hotLimit)*span.Seconds()/60
	admin := e.admin()
	var acctCounted int64
	// Consumption under a lease waits for the lease's renewal or end (up to 40 s) for
	// its report: the poll outlasts that with room for ticks delayed under load.
	acctErr := harness.Poll(acctFlushWait, 100*time.Millisecond, func() (bool, error) {
		b, _, err := admin.Bucket(acctKey, "acct", 0)
		if err != nil || b == nil {
			return false, err
		}
		acctCounted = fixedWindowConsumed(t, b, runStart)
		return acctCounted == int64(at.OK), nil
	})

	// The service's fleet record names a Version 1 gateway's workers "<node>#<worker>"
	// (each has its own batch sequence) and a Version 2 gateway by its node.
	inFleet := func(node string, v1 bool) bool {
		for m := range seen {
			if (!v1 && m == node) || (v1 && strings.HasPrefix(m, node+"#")) {
				return true
			}
		}
		return false
	}
	var rows [][]string
	for i, g := range gws {
		rows = append(rows, []string{g.Name, []string{"1 (previous release)", "2 (current)"}[i],
			fmt.Sprintf("%d / %d", g.Metric("tollgate.sync_sent"), g.Metric("tollgate.sync_failed")),
			fmt.Sprintf("%d / %d", ht.PerGateway[i].OK, ht.PerGateway[i].Limited),
			fmt.Sprint(at.PerGateway[i].OK), fmt.Sprint(ht.PerGateway[i].Degraded + at.PerGateway[i].Degraded),
			fmt.Sprint(inFleet(g.Name, i == 0))})
	}
	logTable(t, fmt.Sprintf("rolling upgrade: a Version 1 and a Version 2 gateway against the new service for %v", duration), harness.Table(
		[]string{"gateway", "wire version", "syncs sent / failed", "hot admitted / refused", "accounting admitted", "degraded", "in tg:{fleet}:nodes"}, rows))
	logTable(t, "rolling upgrade: totals", harness.KV(
		"hot key: admitted / allowance (burst + limit × span)", fmt.Sprintf("%d / %.1f (%+.1f%%, bound +%.0f%%)", ht.OK, allowance, 100*(float64(ht.OK)-allowance)/allowance, 100*overBound),
		"hot key statuses", statusHistogram(tr.hot),
		"accounting key: admitted vs Redis count", fmt.Sprintf("%d vs %d", at.OK, acctCounted),
	))

	if ht.Failed+at.Failed+ht.Unavailable+at.Unavailable+ht.OtherStatus+at.OtherStatus > 0 {
		t.Errorf("requests failed: hot %s, accounting %s", statusHistogram(tr.hot), statusHistogram(tr.acct))
	}
	// A sync fails when its reply is later than the callout timeout: on a machine that
	// stalled the gateway, the service or Redis (a no-op timer and loopback round trip
	// kept waiting hostStall or more during the run, hostdelay.Probe) a few may, which
	// says nothing about the upgrade; otherwise every sync must succeed, and never more
	// than 1 % fail.
	host := hd.Max(runStart, time.Now())
	t.Logf("the host's longest delay during the run: %v (stall: %v or more)", host.Round(time.Millisecond), hostStall)
	for i, g := range gws {
		sent, failed := g.Metric("tollgate.sync_sent"), g.Metric("tollgate.sync_failed")
		if sent == 0 || (failed > 0 && host < hostStall) || failed*100 > sent {
			t.Errorf("%s: %d syncs sent, %d failed, the host's longest delay %v: every sync should succeed", g.Name, sent, failed, host.Round(time.Millisecond))
		}
		if d := ht.PerGateway[i].Degraded + at.PerGateway[i].Degraded; d > 0 {
			// As for the syncs: what the host's stalls explain is logged (degradedEpisodes).
			var mine []harness.Answer
			for _, as := range [][]harness.Answer{tr.hot, tr.acct} {
				for j := range as {
					if as[j].Gateway == i {
						mine = append(mine, as[j])
					}
				}
			}
			unexplained, summary := degradedEpisodes(hd, mine)
			t.Logf("%s: %d degraded answers: %s", g.Name, d, summary)
			if unexplained > 0 {
				t.Errorf("%s: %d degraded answers with the service up that the host's stalls do not explain", g.Name, unexplained)
			}
		}
		if ht.PerGateway[i].Limited == 0 {
			t.Errorf("%s: refused nothing of a key at 10x its limit", g.Name)
		}
		if !inFleet(g.Name, i == 0) {
			t.Errorf("%s is not in the service's fleet record (%v): %v", g.Name, seenErr, seen)
		}
	}
	if float64(ht.OK) > allowance*(1+overBound) {
		t.Errorf("hot key: %d admitted over both gateways, allowance %.1f + %.0f%%", ht.OK, allowance, 100*overBound)
	}
	if acctErr != nil {
		t.Errorf("accounting key: Redis counts %d, the two gateways admitted %d: %v", acctCounted, at.OK, acctErr)
	}
}

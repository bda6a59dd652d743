package e2e

import (
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/rule"
)

// ownService starts a service on a Redis Cluster of its own: the rule sets these
// scenarios store would otherwise reach the services the other scenarios share (a
// service holding rules refuses deltas of rules it does not know), and two gateways
// syncing with it.
func ownService(t *testing.T, e *env, name string) (harness.Admin, []*harness.Gateway) {
	t.Helper()
	admin, gws, _ := ownServiceProcess(t, e, name)
	return admin, gws
}

// ownServiceProcess is ownService that also returns the service's process (to signal it).
func ownServiceProcess(t *testing.T, e *env, name string) (harness.Admin, []*harness.Gateway, *harness.Service) {
	t.Helper()
	rc, err := redistest.LaunchCluster(redistest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Stop)
	svc, err := harness.StartService(harness.ServiceConfig{Bin: e.bins.Service, RedisMode: "cluster", RedisAddrs: rc.Addrs(),
		AdminToken: adminToken, SyncSecret: syncSecret, Args: sharedServiceArgs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Stop)
	gws := e.fleetOn(t, harness.Wazero, []string{svc.Addr()}, uniqueKey(name), 2, `{"rules":[]}`, false, harness.Sync{})
	return harness.Admin{Base: svc.URL(), Token: adminToken}, gws, svc
}

// onVersion waits until every worker of every gateway enforces rule-set version v: the
// rules_version gauge says one worker of a gateway took it, so a probe (on a key of its
// own) on each worker must come back with the limit header of the rule on path.
func onVersion(t *testing.T, gws []*harness.Gateway, v uint64, path string) {
	t.Helper()
	if err := harness.Poll(10*time.Second, 10*time.Millisecond, func() (bool, error) {
		for _, g := range gws {
			if g.Metric("tollgate.rules_version") != int64(v) {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("gateways did not adopt rule set version %d: %v", v, err)
	}
	ctx := ctxFor(t, 15*time.Second)
	probe := uniqueKey("probe")
	for _, g := range gws {
		for w := 0; w < g.Host().Workers(); w++ {
			c := g.WorkerClient(w)
			err := harness.Poll(10*time.Second, 10*time.Millisecond, func() (bool, error) {
				a := c.Get(ctx, g.URL, path, probe)
				return a.Get("X-RateLimit-Limit") != "", nil
			})
			c.Close()
			if err != nil {
				t.Fatalf("%s worker %d does not enforce version %d: %v", g.Name, w, v, err)
			}
		}
	}
}

// dailyQuota is the daily plan of the scenario below: 5,000,000 requests a day, or the
// algorithms' maximum when that is lower.
var dailyQuota = min(5_000_000, int64(algo.MaxLimit))

// TestDailyQuotaAtScale: a 5,000,000-per-day quota (a common API plan) is pushed through
// the admin API and enforced by the gateways without the degraded marker, and
// /v1/usage counts every admitted request; then a rule set the algorithms could not
// enforce is answered 422 naming the field, and the previous version keeps serving.
func TestDailyQuotaAtScale(t *testing.T) {
	t.Parallel()
	e := sharedEnv(t)
	admin, gws := ownService(t, e, "daily")
	limit := strconv.FormatInt(dailyQuota, 10)
	v, err := admin.PutRules([]byte(`{"rules":[{"id":"daily","match":{"prefix":"/api"},"algorithm":"fixed_window","limit":` + limit + `,"window":"1d"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	onVersion(t, gws, v, "/api/probe")
	ctx := ctxFor(t, time.Minute)
	key := uniqueKey("daily")
	const n = 200
	answers := e.client.Run(ctx, harness.Load{Gateways: gws, Path: "/api/quote", Key: key, Rate: 200, Count: n, Workers: 8})
	tally := harness.Count(answers, len(gws))
	if tally.OK != n || tally.Degraded != 0 {
		t.Fatalf("%d of %d admitted, %d degraded: %s", tally.OK, n, tally.Degraded, statusHistogram(answers))
	}
	for _, a := range answers {
		if a.Get("X-RateLimit-Limit") != limit {
			t.Fatalf("X-RateLimit-Limit %q, want %s (headers %v)", a.Get("X-RateLimit-Limit"), limit, a.Header)
		}
	}
	// Gateways report what they admitted out of a lease when the lease is renewed or
	// ends (a lease lives up to two 20 s epochs, RATIONALE.md §2).
	var used int64
	if err := harness.Poll(60*time.Second, 100*time.Millisecond, func() (bool, error) {
		b, _, err := admin.Bucket(key, "daily", 0)
		if err != nil {
			return false, nil
		}
		used = b.Limit - b.Available
		return b.Limit == dailyQuota && used == n, nil
	}); err != nil {
		t.Fatalf("/v1/usage counts %d of %d admitted: %v", used, n, err)
	}
	if sumMetric(gws, "tollgate.deltas_refused") != 0 || sumMetric(gws, "tollgate.sync_batches_dropped") != 0 {
		t.Fatalf("the service refused reports: %d deltas refused, %d batches dropped",
			sumMetric(gws, "tollgate.deltas_refused"), sumMetric(gws, "tollgate.sync_batches_dropped"))
	}

	// One past the algorithms' maximum: refused up front, naming the field.
	over := strconv.FormatInt(int64(algo.MaxLimit)+1, 10)
	_, err = admin.PutRules([]byte(`{"rules":[{"id":"daily","match":{"prefix":"/api"},"limit":` + over + `,"window":"1d"}]}`))
	if err == nil || !strings.Contains(err.Error(), "status 422") || !strings.Contains(strings.ReplaceAll(err.Error(), " ", ""), `"field":"rules[0].limit"`) {
		t.Fatalf("PUT of an unenforceable rule set: %v, want 422 naming rules[0].limit", err)
	}
	if cur, err := admin.RulesVersion(); err != nil || cur != v {
		t.Fatalf("current version %d (%v) after a refused PUT, want %d", cur, err, v)
	}
	more := e.client.Run(ctx, harness.Load{Gateways: gws, Path: "/api/quote", Key: key, Rate: 200, Count: 50, Workers: 8})
	if tl := harness.Count(more, len(gws)); tl.OK != 50 || tl.Degraded != 0 {
		t.Fatalf("after a refused PUT: %d of 50 admitted, %d degraded", tl.OK, tl.Degraded)
	}
	for _, g := range gws {
		if got := g.Metric("tollgate.rules_version"); got != int64(v) {
			t.Errorf("%s: rules_version %d after a refused PUT, want %d", g.Name, got, v)
		}
	}
}

// genWindow draws a window the admin API accepts for kind, often on a bound: limit 1 or
// the maximum, the shortest or the longest window, the maximum burst.
func genWindow(rng *rand.Rand, kind algo.Kind) algo.Params {
	maxLimit := kind.MaxLimit()
	for {
		p := algo.Params{Kind: kind}
		switch rng.Intn(4) {
		case 0:
			p.Limit = 1
		case 1:
			p.Limit = maxLimit
		default:
			p.Limit = 1 + rng.Int63n(20) // small: the traffic below exceeds it
		}
		switch rng.Intn(4) {
		case 0:
			p.WindowUs = algo.MinWindowUs
		case 1:
			p.WindowUs = algo.MaxWindowUs
		default:
			p.WindowUs = (1 + rng.Int63n(algo.MaxWindowUs/1000)) * 1000
		}
		if kind.HasBurst() && rng.Intn(3) == 0 {
			p.Burst = algo.MaxBurst
			if rng.Intn(2) == 0 {
				p.Burst = 1 + rng.Int63n(10)
			}
		}
		if p.Validate() == nil {
			return p
		}
	}
}

// TestGeneratedRuleSetsEnforced: random rule sets the admin API accepts, extremes
// included (limit 1 and algo.MaxLimit, 1 ms and algo.MaxWindowUs windows, maximum
// burst and cost), are pushed to a real service and enforced through the compiled
// filter on two gateways: the service refuses no report, every request is answered
// (admitted or 429), and no key gets more admitted than its limit allows over the run.
func TestGeneratedRuleSetsEnforced(t *testing.T) {
	t.Parallel()
	e := sharedEnv(t)
	admin, gws := ownService(t, e, "generated")
	seed := time.Now().UnixNano()
	if v := os.Getenv("TOLLGATE_TEST_SEED"); v != "" { // replays a logged failure
		var err error
		if seed, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatalf("TOLLGATE_TEST_SEED: %v", err)
		}
	}
	t.Logf("seed %d (TOLLGATE_TEST_SEED replays it)", seed)
	rng := rand.New(rand.NewSource(seed))
	ctx := ctxFor(t, 2*time.Minute)
	hd := hostDelay(t)
	for set := 0; set < 3; set++ {
		var rules []string
		for i := 0; i < 3; i++ {
			algs := rule.Algorithms()
			kind := algs[rng.Intn(len(algs))]
			p := genWindow(rng, kind)
			cost := int64(1)
			if rng.Intn(4) == 0 {
				cost = algo.MaxCost
			}
			// The ids survive from set to set (reports of the previous set's keys are
			// charged under them, as in any rules rollout), the paths are new: a worker
			// still on the previous set matches nothing on them, so a probe answered
			// with limit headers shows the new set is enforced there.
			doc := fmt.Sprintf(`{"id":"g%d","match":{"prefix":"/s%dg%d"},"algorithm":%q,"limit":%d,"window":%q,"cost":%d`,
				i, set, i, kind.String(), p.Limit, rule.FormatWindow(p.WindowUs), cost)
			if p.Burst > 0 {
				doc += fmt.Sprintf(`,"burst":%d`, p.Burst)
			}
			rules = append(rules, doc+"}")
		}
		body := `{"rules":[` + strings.Join(rules, ",") + `]}`
		t.Logf("rule set %d: %s", set, body)
		v, err := admin.PutRules([]byte(body))
		if err != nil {
			t.Fatalf("a generated rule set was refused: %v", err)
		}
		for i := range rules {
			onVersion(t, gws, v, fmt.Sprintf("/s%dg%d/probe", set, i))
		}
		cfg, err := rule.Parse([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		type run struct {
			answers []harness.Answer
			took    time.Duration
		}
		runs := make([]run, len(cfg.Rules))
		done := make(chan int)
		for i := range cfg.Rules {
			go func() {
				start := time.Now()
				a := e.client.Run(ctx, harness.Load{Gateways: gws, Path: fmt.Sprintf("/s%dg%d/x", set, i),
					Key: uniqueKey(fmt.Sprintf("gen%d-%d", set, i)), Rate: 100, Count: 150, Workers: 4})
				runs[i] = run{a, time.Since(start)}
				done <- i
			}()
		}
		for range cfg.Rules {
			<-done
		}
		for i, r := range cfg.Rules {
			p := r.Windows[0]
			tally := harness.Count(runs[i].answers, len(gws))
			if tally.Failed != 0 || tally.Unavailable != 0 || tally.OtherStatus != 0 {
				t.Errorf("set %d rule %s: %s", set, r.ID, statusHistogram(runs[i].answers))
			}
			if tally.Degraded != 0 {
				// Not a refusal: windows of a few ms can outrun the sync interval, and
				// the gateway then decides on its own state and says so.
				t.Logf("set %d rule %s %+v: %d of %d answers degraded", set, r.ID, p, tally.Degraded, tally.Total)
			}
			// What the bucket can give over the run: its capacity, the refill over the run
			// (one more window for the window algorithms' boundary) and the fleet bound
			// (RATIONALE: the refill between a grant and its use, a permit or two).
			elapsedUs := (runs[i].took + time.Second).Microseconds()
			bound := float64(p.Capacity()) + float64(p.Limit)*float64(elapsedUs)/float64(p.WindowUs) + 2
			if !p.Kind.Refills() {
				bound += float64(p.Limit)
			}
			// A run whose degraded answers all followed a stall of the machine
			// (degradedEpisodes) measured the degraded mode, decided on each gateway's
			// own state: its admissions are logged, not held to the bound.
			stalled := false
			if tally.Degraded != 0 {
				unexplained, summary := degradedEpisodes(hd, runs[i].answers)
				stalled = unexplained == 0
				t.Logf("set %d rule %s: %s", set, r.ID, summary)
			}
			if got := float64(tally.OK) * float64(r.Cost); got > bound && stalled {
				t.Logf("set %d rule %s %+v cost %d: %d admitted (%.0f permits), more than %.1f, in a run degraded by the host's stalls", set, r.ID, p, r.Cost, tally.OK, got, bound)
			} else if got > bound {
				t.Errorf("set %d rule %s %+v cost %d: %d admitted (%.0f permits), more than %.1f", set, r.ID, p, r.Cost, tally.OK, got, bound)
			}
		}
		if n := sumMetric(gws, "tollgate.deltas_refused"); n != 0 {
			for _, g := range gws {
				for _, l := range g.Host().Logs() {
					if strings.Contains(l.Message, "refused") {
						t.Logf("%s: %s", g.Name, l.Message)
					}
				}
			}
			t.Fatalf("set %d: the service refused %d reports", set, n)
		}
		if n := sumMetric(gws, "tollgate.sync_batches_dropped"); n != 0 {
			t.Fatalf("set %d: %d sync batches dropped", set, n)
		}
	}
}

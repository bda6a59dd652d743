// Command tollgate-demo shows Tollgate working end to end in under a minute: it builds
// the filter and the sync service, starts a Redis server, the service, a real Envoy (the
// newest release `make envoy` installs, running the shipped envoy.yaml with the demo's
// rule set: the compiled filter on V8, two worker threads) and a small upstream, sends a
// burst from a real HTTP client, and prints what every answer said. With DEMO_KEEP=1 it
// keeps everything running and prints curl commands to try, until Ctrl-C. `make demo`
// runs it after installing redis-server and Envoy.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
	"github.com/tollgate-rl/tollgate/internal/envoyproc"
	"github.com/tollgate-rl/tollgate/internal/redistest"
)

const (
	adminToken = "demo-admin"
	syncSecret = "demo-secret"
	demoKey    = "sk_live_demo"
	deniedKey  = "sk_revoked_2019"
	allowedKey = "sk_internal_ops"
	burstSize  = 30
)

// rules is the demo's rule set: 10 requests a minute on /search with a burst of 15, a
// deny list and an allow list.
const rules = `{
  "allow": ["sk_internal_*"],
  "deny":  ["sk_revoked_*"],
  "rules": [
    {"id": "search", "match": {"prefix": "/search"}, "limit": 10, "window": "1m", "burst": 15}
  ]
}`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, os.Stderr, os.Getenv("DEMO_KEEP") == "1"); err != nil {
		fmt.Fprintln(os.Stderr, "tollgate-demo:", err)
		os.Exit(1)
	}
}

// stack is everything the demo started, stopped in reverse order.
type stack struct {
	bins     *harness.Binaries
	redis    *redistest.Server
	svc      *harness.Service
	upstream *harness.Upstream
	gw       *harness.Gateway
	client   *harness.Client
}

func (s *stack) stop() {
	if s.gw != nil {
		s.gw.Close()
	}
	if s.upstream != nil {
		s.upstream.Close()
	}
	if s.svc != nil {
		s.svc.Stop()
	}
	if s.redis != nil {
		s.redis.Stop()
	}
	if s.client != nil {
		s.client.Close()
	}
	s.bins.Remove()
}

func run(ctx context.Context, out, errw io.Writer, keep bool) error {
	fmt.Fprintf(out, "Tollgate demo: Envoy %s running envoy.yaml (the compiled filter on V8, 2 worker threads), the sync\n", envoyproc.Newest)
	fmt.Fprintln(out, "service, Redis, an upstream.")
	fmt.Fprintln(out)
	s := &stack{}
	defer func() { _ = progress(errw, "stopping everything", func() error { s.stop(); return nil }) }()

	err := progress(errw, "building build/filter.wasm and tollgate-ratelimit (go build)", func() (err error) {
		s.bins, err = harness.Build()
		return err
	})
	if err != nil {
		return err
	}
	err = progress(errw, "starting redis-server", func() (err error) {
		s.redis, err = redistest.Launch(redistest.Options{})
		if errors.Is(err, redistest.ErrNoRedis) {
			return fmt.Errorf("%w\n(`make demo` installs it: `make redis`)", err)
		}
		return err
	})
	if err != nil {
		return err
	}
	err = progress(errw, "starting the sync service, the upstream and Envoy "+envoyproc.Newest, func() (err error) {
		if s.svc, err = harness.StartService(harness.ServiceConfig{
			Bin: s.bins.Service, RedisAddrs: s.redis.Addrs(), AdminToken: adminToken, SyncSecret: syncSecret,
		}); err != nil {
			return err
		}
		if s.upstream, err = harness.StartUpstream(); err != nil {
			return err
		}
		s.gw, err = harness.StartGateway(harness.GatewayConfig{
			Host: harness.EnvoyHost(envoyproc.Newest),
			Wasm: s.bins.Wasm, Workers: 2, NodeID: "demo-gw", Rules: []byte(rules),
			Services: []string{s.svc.Addr()}, Secret: syncSecret, Upstream: s.upstream.URL,
		})
		return err
	})
	if err != nil {
		return err
	}
	s.client = harness.NewClient()

	fmt.Fprintf(out, "Redis %s · service %s · Envoy %s (admin %s) · upstream %s\n\n", s.redis.Addr(), s.svc.URL(), s.gw.URL, s.gw.Envoy().Admin, s.upstream.URL)
	fmt.Fprintln(out, "Rule set (the filter's plugin configuration):")
	fmt.Fprintln(out, indent(rules, "  "))
	fmt.Fprintln(out)

	// The burst: one request after the other, so the table reads in order.
	fmt.Fprintf(out, "A client sends %d requests to /search with x-api-key: %s as fast as it can:\n\n", burstSize, demoKey)
	var rows [][]string
	admitted, limited := 0, 0
	firstRetry := ""
	var retries []string // distinct Retry-After values, in order
	for i := 1; i <= burstSize; i++ {
		a := s.client.Get(ctx, s.gw.URL, fmt.Sprintf("/search?q=tollgate&page=%d", i), demoKey)
		if a.Err != nil {
			return fmt.Errorf("request %d: %w", i, a.Err)
		}
		switch a.Status {
		case 200:
			admitted++
		case 429:
			limited++
			if firstRetry == "" {
				firstRetry = a.Get("Retry-After")
			}
			if ra := a.Get("Retry-After"); !slices.Contains(retries, ra) {
				retries = append(retries, ra)
			}
		}
		rows = append(rows, []string{fmt.Sprint(i), fmt.Sprint(a.Status), dash(a.Get("X-RateLimit-Remaining")),
			dash(a.Get("Retry-After")), dash(a.Get("RateLimit"))})
	}
	fmt.Fprint(out, harness.Table([]string{"#", "status", "X-RateLimit-Remaining", "Retry-After", "RateLimit"}, rows))
	fmt.Fprintln(out)

	// Lists: a revoked key and an internal one.
	denied := s.client.Get(ctx, s.gw.URL, "/search?q=x", deniedKey)
	allowed := make([]harness.Answer, 20)
	for i := range allowed {
		allowed[i] = s.client.Get(ctx, s.gw.URL, "/search?q=x", allowedKey)
	}
	allowedOK := 0
	for i := range allowed {
		if allowed[i].Status == 200 && allowed[i].Get("X-RateLimit-Policy") == "bypass" {
			allowedOK++
		}
	}
	fmt.Fprint(out, harness.Table([]string{"key", "requests", "answer"}, [][]string{
		{deniedKey, "1", fmt.Sprintf("%d %s", denied.Status, strings.TrimSpace(string(denied.Body)))},
		{allowedKey, fmt.Sprint(len(allowed)), fmt.Sprintf("%d × 200 with X-RateLimit-Policy: bypass", allowedOK)},
	}))
	fmt.Fprintln(out)

	// A client that honours Retry-After comes back once, when told to.
	wait := 1
	fmt.Sscan(firstRetry, &wait)
	time.Sleep(time.Duration(wait) * time.Second)
	again := s.client.Get(ctx, s.gw.URL, "/search?q=tollgate&page=31", demoKey)
	fmt.Fprintf(out, "After waiting the %d s the first 429 asked for, the client tries once more:\n\n", wait)
	fmt.Fprint(out, harness.Table([]string{"#", "status", "X-RateLimit-Remaining", "Retry-After", "RateLimit"}, [][]string{
		{fmt.Sprint(burstSize + 1), fmt.Sprint(again.Status), dash(again.Get("X-RateLimit-Remaining")), dash(again.Get("Retry-After")), dash(again.Get("RateLimit"))},
	}))
	fmt.Fprintln(out)

	// What the service and Redis saw, once the gateway's workers have reported it all.
	admin := harness.Admin{Base: s.svc.URL(), Token: adminToken}
	var remaining, outstanding, charged int64 = 0, 0, -1
	total := admitted
	if again.Status == 200 {
		total++
	}
	_ = harness.Poll(3*time.Second, 50*time.Millisecond, func() (bool, error) {
		b, _, err := admin.Bucket(demoKey, "search", 0)
		if err != nil || b == nil {
			return false, err
		}
		remaining, outstanding = b.Remaining, b.Outstanding
		charged = b.Burst - b.Remaining - b.Outstanding // no refill worth a permit yet: the demo takes seconds
		return charged >= int64(total), nil
	})

	fmt.Fprintln(out, "Summary")
	fmt.Fprintf(out, "  %d of %d admitted, %d refused with 429. The rule's bucket holds a burst of 15 and refills 10 a minute\n", admitted, burstSize, limited)
	fmt.Fprintln(out, "  (one permit every 6 s), so a burst gets 15 and then waits.")
	if admitted > 15 {
		fmt.Fprintf(out, "  %d more than the burst were admitted: the gateway admitted them on its cold-start allowance before\n", admitted-15)
		fmt.Fprintln(out, "  its first sync reply; the service charges them as debt (RATIONALE.md §3).")
	}
	if wait >= 6 {
		fmt.Fprintf(out, "  The first refusal says Retry-After: %d: the next permit comes in 6 s, rounded up, plus up to 1 s of\n", wait)
		fmt.Fprintln(out, "  jitter so refused clients do not all come back at the same moment.")
	} else {
		fmt.Fprintf(out, "  The first refusal says Retry-After: %d: the gateway had spent its own share before its first sync\n", wait)
		fmt.Fprintln(out, "  reply, so it asks the client back after the next sync rather than blaming it (RATIONALE.md §3).")
	}
	if len(retries) > 1 {
		fmt.Fprintf(out, "  Retry-After values in the burst: %s (jitter spreads them; a client that keeps ignoring them earns\n", strings.Join(retries, ", "))
		fmt.Fprintln(out, "  a growing progressive-penalty cooldown).")
	}
	switch again.Status {
	case 429:
		fmt.Fprintf(out, "  Coming back when told, the client got 429 with Retry-After: %s, the fleet-wide bucket's wait.\n", dash(again.Get("Retry-After")))
	case 200:
		fmt.Fprintln(out, "  Coming back when told, the client was admitted: by then the bucket had refilled a permit.")
	default:
		fmt.Fprintf(out, "  Coming back when told, the client got %d.\n", again.Status)
	}
	fmt.Fprintln(out, "  Every answer carries X-RateLimit-Limit/Remaining/Reset and the IETF RateLimit-Policy/RateLimit headers.")
	fmt.Fprintf(out, "  %s got 403 from the deny list; %s bypassed the limit (allow list).\n", deniedKey, allowedKey)
	fmt.Fprintf(out, "  The upstream saw %d requests: refused ones never reach it.\n", s.upstream.Requests())
	if charged >= 0 {
		fmt.Fprintf(out, "  Redis (GET /v1/usage/%s): %d in use (what was charged, less what has refilled since), %d more\n", demoKey, charged, outstanding)
		fmt.Fprintf(out, "  leased to the gateway, %d left.\n", remaining)
	}
	m := func(name string) int64 { return s.gw.Metric("tollgate." + name) }
	fmt.Fprintf(out, "  Envoy asked the sync service %d times while a request waited (acquires: a bucket without a\n", m("acquires"))
	fmt.Fprintln(out, "  usable lease); every other request was decided locally, and what it consumed was reported in the background.")
	fmt.Fprintf(out, "  Envoy's stats (/stats): requests_allowed %d, requests_rejected %d, requests_denied_by_list %d, requests_bypassed %d, sync_sent %d\n",
		m("requests_allowed"), m("requests_rejected"), m("requests_denied_by_list"), m("requests_bypassed"), m("sync_sent"))
	if line := lastRefusal(s.gw); line != "" {
		fmt.Fprintf(out, "  Envoy's access log line of a refused request (%s carries the decision):\n", "%FILTER_STATE(wasm.tollgate:PLAIN)%")
		fmt.Fprintln(out, "    "+line)
	}
	fmt.Fprintln(out)

	if !keep {
		fmt.Fprintln(out, "Run `make demo DEMO_KEEP=1` to keep it running and try it yourself.")
		return nil
	}
	fmt.Fprintln(out, "Still running (DEMO_KEEP=1). Try:")
	fmt.Fprintf(out, "  curl -i -H 'x-api-key: %s' '%s/search?q=hello'\n", demoKey, s.gw.URL)
	fmt.Fprintf(out, "  curl -i -H 'x-api-key: %s' '%s/search?q=hello'\n", deniedKey, s.gw.URL)
	fmt.Fprintf(out, "  curl -s -H 'Authorization: Bearer %s' %s/v1/usage/%s\n", adminToken, s.svc.URL(), demoKey)
	fmt.Fprintf(out, "  curl -s %s/stats/prometheus | grep tollgate_rule\n", s.gw.Envoy().Admin)
	fmt.Fprintf(out, "  curl -s -X PUT -H 'Authorization: Bearer %s' %s/v1/rules -d '{\"rules\":[{\"id\":\"search\",\"match\":{\"prefix\":\"/search\"},\"limit\":100,\"window\":\"1m\"}]}'\n", adminToken, s.svc.URL())
	fmt.Fprintln(out, "  (the gateway picks a new rule set up with its next sync, i.e. after its next request)")
	fmt.Fprintln(out, "Ctrl-C stops everything.")
	<-ctx.Done()
	fmt.Fprintln(out)
	return nil
}

// lastRefusal is the gateway's last access-log line of a 429 (Envoy writes its access
// log once a second; this waits for it that long at most).
func lastRefusal(g *harness.Gateway) string {
	var line string
	_ = harness.Poll(2*time.Second, 100*time.Millisecond, func() (bool, error) {
		for _, l := range strings.Split(g.AccessLog(), "\n") {
			if strings.Contains(l, " 429 ") {
				line = l
			}
		}
		return line != "", nil
	})
	return line
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func indent(s, prefix string) string {
	lines := strings.Split(s, "\n")
	for i := range lines {
		lines[i] = prefix + lines[i]
	}
	return strings.Join(lines, "\n")
}

// progress runs f while showing what is happening on w: a spinner on a terminal, dots
// otherwise (one per half second), then the time it took.
func progress(w io.Writer, what string, f func() error) error {
	tty := isTerminal(w)
	start := time.Now()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		frames := []string{"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"}
		if !tty {
			fmt.Fprintf(w, "%s ", what)
		}
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			if tty {
				fmt.Fprintf(w, "\r%s %s", frames[i%len(frames)], what)
			} else if i > 0 && i%5 == 0 {
				fmt.Fprint(w, ".")
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	err := f()
	close(done)
	wg.Wait()
	took := time.Since(start).Round(10 * time.Millisecond)
	mark, sign := "done", "✓"
	if err != nil {
		mark, sign = "failed", "✗"
	}
	if tty {
		fmt.Fprintf(w, "\r\033[K%s %s (%s, %v)\n", sign, what, mark, took)
	} else {
		fmt.Fprintf(w, " %s (%v)\n", mark, took)
	}
	return err
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

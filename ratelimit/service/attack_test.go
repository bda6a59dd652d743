package service

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// The tests in this file attack a real service (HTTP, Redis) the way a client that
// reaches the sync port would: first without the secret, then with it (a leaked or
// shared secret) but with forged content. Each forgery must be refused or neutralised.

// TestAttackNoSecret: without the right secret nothing is accepted, whatever the
// Authorization header looks like, and a service given no secret locks the sync API
// unless it runs insecure on purpose.
func TestAttackNoSecret(t *testing.T) {
	batch := encode(&wire.Batch{Node: uniq("atk"), Seq: uint64(time.Now().UnixMicro()),
		Deltas: []wire.Delta{delta(uniq("k"), "r", algo.TokenBucket, 10, 60_000)}})
	withSecret := start(t, opts{})
	noSecret := start(t, opts{svc: func(c *Config) { c.SyncSecret, c.AdminToken = "", "" }})
	insecure := start(t, opts{svc: func(c *Config) { c.SyncSecret, c.Insecure = "", true }})
	headers := map[string]string{
		"none":          "",
		"empty bearer":  "Bearer ",
		"blank bearer":  "Bearer  ",
		"wrong secret":  "Bearer nope",
		"admin token":   "Bearer " + adminToken,
		"other scheme":  "Basic " + syncSecret,
		"secret prefix": "Bearer " + syncSecret[:4],
	}
	type target struct{ method, path string }
	syncAPI := []target{{"POST", "/v1/sync"}, {"POST", "/v1/check"}, {"GET", "/v1/sync/rules"}}
	adminAPI := []target{{"GET", "/v1/rules"}, {"GET", "/v1/lists/allow"}, {"GET", "/v1/usage/k"}, {"POST", "/v1/reset/k"}}
	tests := []struct {
		name    string
		in      *instance
		targets []target
		headers []string
		want    int
	}{
		{"sync API, secret set", withSecret, syncAPI, []string{"none", "empty bearer", "blank bearer", "wrong secret", "admin token", "other scheme", "secret prefix"}, http.StatusUnauthorized},
		{"admin API, token set", withSecret, adminAPI, []string{"none", "empty bearer", "blank bearer", "wrong secret", "other scheme"}, http.StatusUnauthorized},
		{"sync API, no secret configured", noSecret, syncAPI, []string{"none", "empty bearer", "wrong secret"}, http.StatusUnauthorized},
		{"admin API, no token configured", noSecret, adminAPI, []string{"none", "empty bearer"}, http.StatusUnauthorized},
		{"sync API, insecure on purpose", insecure, []target{{"POST", "/v1/sync"}}, []string{"none", "empty bearer"}, http.StatusOK},
	}
	for _, tc := range tests {
		for _, tg := range tc.targets {
			for _, h := range tc.headers {
				t.Run(fmt.Sprintf("%s/%s %s/%s", tc.name, tg.method, tg.path, h), func(t *testing.T) {
					var body []byte
					if tg.method == "POST" {
						body = batch
					}
					code, _, out := tc.in.do(t, tg.method, tg.path, "", body, "Authorization", headers[h])
					if code != tc.want {
						t.Fatalf("%d %s, want %d", code, out, tc.want)
					}
				})
			}
		}
	}
}

// pushRules puts a rule set and waits until the instance applies it.
func pushRules(t testing.TB, in *instance, body string) {
	t.Helper()
	before := in.svc.Watcher().Version()
	if code, _, out := in.do(t, http.MethodPut, "/v1/rules", adminToken, []byte(body)); code != http.StatusOK {
		t.Fatalf("PUT /v1/rules: %d %s", code, out)
	}
	eventually(t, 5*time.Second, "rules version", func() bool { return in.svc.Watcher().Version() > before })
}

// post sends a batch as given (node name included) with the sync secret.
func (in *instance) post(t testing.TB, b *wire.Batch) (int, *wire.Reply, string) {
	t.Helper()
	body, err := wire.AppendBatch(nil, b)
	if err != nil {
		t.Fatal(err)
	}
	code, _, out := in.do(t, http.MethodPost, "/v1/sync", syncSecret, body)
	if code != http.StatusOK {
		return code, nil, string(out)
	}
	var r wire.Reply
	if err := wire.DecodeReply(out, &r); err != nil {
		t.Fatalf("reply: %v", err)
	}
	return code, &r, ""
}

// available is what the caller key's only bucket could admit, leases aside, per the
// admin API.
func (in *instance) available(t testing.TB, key string) int64 {
	t.Helper()
	code, _, out := in.do(t, http.MethodGet, "/v1/usage/"+key, adminToken, nil)
	if code != http.StatusOK {
		t.Fatalf("usage: %d %s", code, out)
	}
	var u store.Usage
	decodeJSON(t, out, &u)
	if len(u.Buckets) != 1 {
		t.Fatalf("usage of %q: %d buckets, want 1: %s", key, len(u.Buckets), out)
	}
	return u.Buckets[0].Available
}

// TestAttackForgedContent: a client holding the secret forges what it reports.
func TestAttackForgedContent(t *testing.T) {
	// The rule set is global to a Redis: a server of its own, so the package's other
	// tests keep running without one.
	srv := redistest.StartStandalone(t)
	in := start(t, opts{addrs: srv.Addrs()})
	pushRules(t, in, `{"rules":[`+
		`{"id":"atk","limit":10,"window":"1m"},`+
		`{"id":"seq","limit":100,"window":"1h"}]}`)
	rdb := in.st.Client()
	ctx := context.Background()

	t.Run("huge over is clamped to one capacity of debt", func(t *testing.T) {
		key := uniq("over")
		d := delta(key, "atk", algo.TokenBucket, 10, 60_000)
		d.Over = math.MaxUint32
		d.ElapsedMs = math.MaxUint32 // the longest period a report can claim
		clampedBefore := metricValue(t, in, "tollgate_debt_clamped_permits_total") + metricValue(t, in, "tollgate_report_excess_permits_total")
		code, r, out := in.post(t, &wire.Batch{Node: uniq("atk"), Seq: uint64(time.Now().UnixMicro()), Deltas: []wire.Delta{d}})
		if code != http.StatusOK {
			t.Fatalf("%d %s", code, out)
		}
		st := r.States[0]
		// Debt of one capacity on 10/min: the next permit is a window and one permit's
		// refill away (66 s), not the 24.8 days four billion permits would cost.
		if st.RetryInMs > 66_000 || st.RetryInMs == 0 {
			t.Errorf("retry in %d ms, want (0, 66000]", st.RetryInMs)
		}
		if got := in.available(t, key); got < -10 {
			t.Errorf("available %d, want >= -10 (one capacity of debt)", got)
		}
		if ttl := rdb.PTTL(ctx, store.BucketKey(key, "atk", "", 0)).Val(); ttl <= 0 || ttl > 4*time.Minute {
			t.Errorf("bucket TTL %v, want (0, 4m]: refilled within two windows", ttl)
		}
		// Beyond what 10/min admits over the 49.7 days the report claims, then beyond one
		// capacity of debt: together all but a capacity or two.
		if got := metricValue(t, in, "tollgate_debt_clamped_permits_total") + metricValue(t, in, "tollgate_report_excess_permits_total") - clampedBefore; got < math.MaxUint32-20 {
			t.Errorf("clamped permits counted %.0f, want about %d", got, uint32(math.MaxUint32))
		}
	})

	// A report charges at most what the rule could admit over the period it covers (one
	// capacity, plus the limit for every window of it, rounded up): 150 on 100/hour from
	// a gateway that never had a reply for the bucket (elapsed 0) is charged 100, the
	// rest counted as excess; a report inside the bound is charged in full.
	t.Run("consumption beyond the reported period is clamped", func(t *testing.T) {
		for _, tc := range []struct {
			name                  string
			over, elapsedMs       uint32
			wantAvail, wantExcess int64
		}{
			{"forged", 150, 0, 0, 50},
			{"honest", 100, 0, 0, 0},
			{"honest over two windows", 130, 1_000, -30, 0},
		} {
			t.Run(tc.name, func(t *testing.T) {
				key := uniq("excess")
				d := delta(key, "seq", algo.TokenBucket, 100, 3_600_000)
				d.Over, d.ElapsedMs = tc.over, tc.elapsedMs
				before := metricValue(t, in, "tollgate_report_excess_permits_total")
				code, r, out := in.post(t, &wire.Batch{Node: uniq("atk"), Seq: uint64(time.Now().UnixMicro()), Deltas: []wire.Delta{d}})
				if code != http.StatusOK || r.States[0].Flags&wire.StateRefused != 0 {
					t.Fatalf("%d %s %+v", code, out, r)
				}
				if got := in.available(t, key); got != tc.wantAvail {
					t.Errorf("available %d after a report of %d over %d ms, want %d", got, tc.over, tc.elapsedMs, tc.wantAvail)
				}
				if got := int64(metricValue(t, in, "tollgate_report_excess_permits_total") - before); got != tc.wantExcess {
					t.Errorf("excess counted %d, want %d", got, tc.wantExcess)
				}
			})
		}
	})

	t.Run("future seq refused and the real gateway's next batch charged", func(t *testing.T) {
		key, node := uniq("seq"), uniq("gw")
		seq := uint64(time.Now().UnixMicro())
		report := func(over uint32) *wire.Batch {
			d := delta(key, "seq", algo.TokenBucket, 100, 3_600_000)
			d.Over = over
			seq++
			return &wire.Batch{Node: node, Seq: seq, Deltas: []wire.Delta{d}}
		}
		if code, _, out := in.post(t, report(1)); code != http.StatusOK {
			t.Fatalf("honest batch: %d %s", code, out)
		}
		for _, forged := range []uint64{math.MaxUint64, uint64(time.Now().Add(11 * time.Minute).UnixMicro())} {
			b := report(50)
			b.Seq = forged
			if code, _, out := in.post(t, b); code != http.StatusBadRequest || !strings.Contains(out, "seq") {
				t.Fatalf("forged seq %d: %d %s, want 400 naming the seq", forged, code, out)
			}
		}
		if code, _, out := in.post(t, report(3)); code != http.StatusOK {
			t.Fatalf("honest batch after the forgery: %d %s", code, out)
		}
		// 1 + 3 charged, the forged 50 twice not at all.
		if got := in.available(t, key); got != 96 {
			t.Fatalf("available %d after charging 1 and 3 of 100, want 96 (the honest batch after the forgery counted, the forged ones not)", got)
		}
	})

	t.Run("unknown rule refused naming the delta, the rest applied", func(t *testing.T) {
		key := uniq("rule")
		good := delta(key, "atk", algo.TokenBucket, 10, 60_000)
		good.Over = 2
		bad := delta(key, "invented", algo.TokenBucket, 1_000_000, 1000)
		bad.Over = 5
		code, r, out := in.post(t, &wire.Batch{Node: uniq("atk"), Seq: uint64(time.Now().UnixMicro()), Deltas: []wire.Delta{good, bad}})
		if code != http.StatusOK {
			t.Fatalf("%d %s", code, out)
		}
		if st := r.States[1]; st.Flags&wire.StateRefused == 0 || st.Key != key || st.Rule != "invented" || !strings.Contains(st.Reason, "rule") {
			t.Fatalf("unknown rule: %+v, want refused with its key, rule and a reason naming the rule", st)
		}
		if st := r.States[0]; st.Flags&wire.StateRefused != 0 {
			t.Fatalf("the valid delta was refused too: %+v", st)
		}
		if n, _ := rdb.Exists(ctx, store.BucketKey(key, "invented", "", 0)).Result(); n != 0 {
			t.Fatalf("a bucket of the invented rule exists in Redis")
		}
	})
}

// TestAttackFakeNodes: 5,000 invented node ids, each sending a signed heartbeat, leave
// the fleet size that an honest gateway syncing every 100 ms is told unchanged.
func TestAttackFakeNodes(t *testing.T) {
	srv := redistest.StartStandalone(t) // the fleet set is global: a server of its own
	in := start(t, opts{addrs: srv.Addrs()})
	honest := uniq("honest")
	var seq atomic.Uint64
	seq.Store(uint64(time.Now().UnixMicro()))
	beat := func() uint32 {
		code, r, out := in.post(t, &wire.Batch{Node: honest, Seq: seq.Add(1)})
		if code != http.StatusOK {
			t.Errorf("honest heartbeat: %d %s", code, out)
			return 0
		}
		return r.Nodes
	}
	eventually(t, 10*time.Second, "the honest gateway counted", func() bool { time.Sleep(90 * time.Millisecond); return beat() == 1 })

	var (
		mu       sync.Mutex
		sizes    []uint32
		stop     = make(chan struct{})
		honestWG sync.WaitGroup
	)
	honestWG.Add(1)
	go func() {
		defer honestWG.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			n := beat()
			mu.Lock()
			sizes = append(sizes, n)
			mu.Unlock()
		}
	}()
	const fakes, workers = 5000, 16
	var wg sync.WaitGroup
	var refused atomic.Int64
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < fakes; i += workers {
				body := encode(&wire.Batch{Node: fmt.Sprintf("fake-%d-%s", i, honest), Seq: uint64(time.Now().UnixMicro())})
				req, _ := http.NewRequest(http.MethodPost, in.http.URL+"/v1/sync", strings.NewReader(string(body)))
				req.Header.Set("Authorization", "Bearer "+syncSecret)
				resp, err := client.Do(req)
				if err != nil {
					refused.Add(1)
					continue
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					refused.Add(1)
				}
			}
		}(w)
	}
	wg.Wait()
	// Two refresh periods and a probation after the last fake: any join would show.
	time.Sleep(3 * time.Second)
	close(stop)
	honestWG.Wait()
	if n := refused.Load(); n != 0 {
		t.Fatalf("%d fake heartbeats were not answered 200 (the attack must be neutralised, not merely fail)", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sizes) < 10 {
		t.Fatalf("only %d honest heartbeats during the attack", len(sizes))
	}
	for i, n := range sizes {
		if n != 1 {
			t.Fatalf("honest heartbeat %d of %d was told a fleet of %d, want 1 (sizes %v)", i, len(sizes), n, sizes)
		}
	}
	t.Logf("%d fake ids; %d honest heartbeats all told a fleet of 1", fakes, len(sizes))
}

// metricValue reads an unlabelled counter or gauge from the instance's /metrics (0 when
// absent).
func metricValue(t testing.TB, in *instance, name string) float64 {
	t.Helper()
	_, _, out := in.do(t, http.MethodGet, "/metrics", "", nil)
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return 0
}

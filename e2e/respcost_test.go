package e2e

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
	"github.com/tollgate-rl/tollgate/internal/llmapi"
)

// startLLM starts an HTTP server answering like an LLM API: each completion takes
// latency and reports the tokens the request asks for in x-test-tokens, as an event
// stream with its usage in the last event.
func startLLM(t *testing.T, latency time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tokens, _ := strconv.ParseInt(r.Header.Get("x-test-tokens"), 10, 64)
		time.Sleep(latency)
		h, body := llmapi.Response("sse", tokens, 2000)
		for _, kv := range h {
			w.Header().Set(kv[0], kv[1])
		}
		_, _ = w.Write(body)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

// TestResponseCostFleet: four gateways (the compiled filter, two workers each) share one
// key's 10,000 tokens a minute through the sync service on Redis Cluster, each response
// an event stream reporting its tokens. The fleet stops within the stated bound (RATIONALE
// "Response-based cost"): the limit, its refill, and per gateway the responses that ended
// before the service heard of them — those of one sync interval and its round trip, plus
// the last one admitted — at the largest response's size. It runs on every host.
func TestResponseCostFleet(t *testing.T) {
	forHostsAtOnce(t, harness.Hosts(), testResponseCostFleet)
}

func testResponseCostFleet(t *testing.T, host string) {
	e := sharedEnv(t)
	id := uniqueKey("tokens")
	const (
		limit     = 10000
		maxTokens = 900
		latency   = 20 * time.Millisecond
	)
	rules := fmt.Sprintf(`{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,"rules":[
	  {"id":"%s","match":{"prefix":"/v1/chat"},"limit":%d,"window":"1m","cost":10,"cost_from":{"body":"usage.total_tokens"}}]}`, id, limit)
	llm := startLLM(t, latency)
	gws := startGateways(t, 4, func(i int) harness.GatewayConfig {
		return harness.GatewayConfig{
			Host: host, Wasm: e.bins.Wasm, Workers: 2, NodeID: fmt.Sprintf("%s-gw%d", id, i+1),
			Rules: []byte(rules), Pin: pinned, Services: e.serviceAddrs(), Secret: syncSecret,
			Sync: harness.Sync{ExpectedNodes: 4}, Upstream: llm,
		}
	})
	ctx := ctxFor(t, 60*time.Second)
	var used, admitted, refused atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for g := range gws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// One request at a time per gateway, until it has refused 10 in a row.
			for i, inARow := 0, 0; inARow < 10 && i < 400; i++ {
				tokens := int64(300 + (i*37+g*101)%600)
				a := e.client.Get(ctx, gws[g].URL, "/v1/chat/completions", id, [2]string{"x-test-tokens", strconv.FormatInt(tokens, 10)})
				switch {
				case a.Err != nil:
					t.Error(a.Err)
					return
				case a.OK():
					used.Add(tokens)
					admitted.Add(1)
					inARow = 0
				case a.Status == 429:
					refused.Add(1)
					inARow++
				default:
					t.Errorf("gateway %d: status %d %s", g, a.Status, a.Body)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	// Responses a gateway ends within one sync interval and its round trip (100 ms and
	// the 250 ms timeout at most), one at a time, each taking latency at least.
	perInterval := int64((100*time.Millisecond + 250*time.Millisecond) / latency)
	bound := int64(limit) + int64(limit)*elapsed.Milliseconds()/60000 + int64(len(gws))*(perInterval+1)*maxTokens
	t.Logf("%d admitted, %d refused, %d tokens used in %s (bound %d)", admitted.Load(), refused.Load(), used.Load(), elapsed.Round(time.Millisecond), bound)
	if used.Load() > bound {
		t.Errorf("the fleet let %d tokens be used, more than the bound %d", used.Load(), bound)
	}
	if used.Load() < limit {
		t.Errorf("the fleet stopped at %d tokens, short of the limit %d", used.Load(), limit)
	}
	if n := sumMetric(gws, "tollgate.response_cost_missing"); n != 0 {
		t.Errorf("%d responses' cost not found", n)
	}
	if n := sumMetric(gws, "tollgate.deltas_refused"); n != 0 {
		t.Errorf("the service refused %d reports", n)
	}
}

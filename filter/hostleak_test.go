//go:build !wasip1

// The host tests start processes and listeners (Redis, the sync service, wazero VMs):
// they run on the build machine, never inside a wasip1 module.

package main

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tetratelabs/wazero/api"

	wasmhost "github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// Memory stays bounded however many callers there are. Requests go through the
// host's direct Exchange path (the full ABI sequence per request, without goroutines or
// HTTP) on both workers at once, for keys cycling over more callers than the bucket
// table has slots, so buckets are created and evicted all the time.
//
// The binding pins every buffer the host allocates in the module until the host call
// returns (filter/abi PinnedBuffers); a pin that outlived its call would keep the
// buffer alive, and so would any per-request state the plugin forgot to drop (streams,
// callout tokens, pending deltas). Either shows as growth of the module's linear memory,
// which a Go module never gives back. After a warm-up that fills the slot table, the
// pending maps and the heap, memory must not grow by more than growthBound; the log
// line says how many bytes per request that bound stands for (a leaked pin costs at
// least 32: its entry in the pin list and the smallest buffer). Shared data must stay
// within the table's slots.
func TestHostMemoryBounded(t *testing.T) {
	const (
		keys        = 200_000
		slots       = 1 << 16 // filter/plugin/table.go defaultSlots
		growthBound = 2 << 20
	)
	refused := closedPort(t)
	tests := []struct {
		name string
		// requests in all (short: in -short mode); the first warm of them fill the
		// slot table, the pending maps and the heap before memory is measured.
		requests, short, warm int
		config                string
		clusters              map[string][]string
		check                 func(t *testing.T, m map[string]int64)
	}{{
		// Local decisions only: the plain hot path.
		name:     "local",
		requests: 1_000_000, short: 300_000, warm: 80_000,
		config: `{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"api","limit":50,"window":"1h"}]}`,
	}, {
		// The sync service is unreachable for the whole run: every bucket keeps its
		// degraded admissions for the service in its record, the urgent queue fills, the
		// syncing worker keeps one unacknowledged batch, the breaker backs off, and
		// answers are degraded.
		name:     "service_unreachable",
		requests: 400_000, short: 400_000, warm: 150_000,
		config: `{"key":{"source":"header","name":"x-api-key"},
			"sync":{"cluster":"tollgate_ratelimit","secret":"s","interval_ms":100,"timeout_ms":250},
			"rules":[{"id":"api","limit":50,"window":"1h"}]}`,
		clusters: map[string][]string{"tollgate_ratelimit": {refused}},
		check: func(t *testing.T, m map[string]int64) {
			if m["tollgate.answers_degraded"] == 0 || m["tollgate.sync_failed"] == 0 {
				t.Errorf("the service was unreachable but nothing says so: degraded %d, sync_failed %d", m["tollgate.answers_degraded"], m["tollgate.sync_failed"])
			}
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, warm := tt.requests, tt.warm
			if testing.Short() {
				n = tt.short
			}
			h := newGateway(t, wasmhost.Config{Workers: 2, PluginConfig: []byte(tt.config), Clusters: tt.clusters})
			if tt.clusters != nil {
				// Until a sync has failed the gateway asks the service for buckets it has
				// no lease for, which pauses the request; Exchange cannot pause.
				waitMetric(t, h, "tollgate.sync_failed", 1)
				time.Sleep(100 * time.Millisecond) // every worker rereads the shared health
			}
			run := func(from, to int) {
				var wg sync.WaitGroup
				for w := 0; w < h.Workers(); w++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						req := keyRequest("/orders", "")
						up := &wasmhost.Response{Status: 200}
						for i := from + w; i < to; i += h.Workers() {
							req.Header[0][1] = "caller-" + strconv.Itoa(i%keys)
							r, err := h.Exchange(w, req, up)
							if err != nil {
								t.Errorf("request %d: %v", i, err)
								return
							}
							if r.Status != 200 && r.Status != 429 {
								t.Errorf("request %d: status %d %s", i, r.Status, r.Body)
								return
							}
						}
					}()
				}
				wg.Wait()
			}
			run(0, warm)
			before := memorySizes(h)
			run(warm, n)
			after := memorySizes(h)
			if t.Failed() {
				return
			}
			for w := range after {
				t.Logf("worker %d: linear memory %d KiB after %d requests, %d KiB after %d (a leak above %.1f bytes per request would show)",
					w, before[w]>>10, warm, after[w]>>10, n, float64(growthBound)/float64((n-warm)/h.Workers()))
				if after[w] > before[w]+growthBound {
					t.Errorf("worker %d: linear memory grew from %d to %d bytes over %d requests (bound %d)", w, before[w], after[w], n-warm, growthBound)
				}
			}
			m := h.Metrics()
			if got := m["tollgate.requests_allowed"] + m["tollgate.requests_rejected"]; got != int64(n) {
				t.Errorf("%d requests decided, %d sent", got, n)
			}
			if m["tollgate.bucket_evictions"] == 0 {
				t.Errorf("no bucket was evicted with %d callers for %d slots: eviction was not exercised", keys, slots)
			}
			// The slots, the fence key (table.go), the fetched rule set (tg:rules) and
			// the sync's four (syncstate.go).
			if k := h.SharedDataKeys(); k > slots+6 {
				t.Errorf("shared data holds %d keys, more than the table's %d slots and 6 fixed keys", k, slots)
			}
			t.Logf("shared data: %d keys, %d bytes; evictions %d", h.SharedDataKeys(), h.SharedDataBytes(), m["tollgate.bucket_evictions"])
			if tt.check != nil {
				tt.check(t, m)
			}
		})
	}
}

// waitMetric waits (bounded) until metric reaches at least n.
func waitMetric(t *testing.T, h *wasmhost.Host, metric string, n int64) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); h.Metrics()[metric] < n; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s stayed at %d, want %d", metric, h.Metrics()[metric], n)
		}
	}
}

// memorySizes reads each worker's linear memory size.
func memorySizes(h *wasmhost.Host) []uint32 {
	out := make([]uint32, h.Workers())
	for w := range out {
		h.CallOnVM(w, func(_ context.Context, mod api.Module) { out[w] = mod.Memory().Size() })
	}
	return out
}

// closedPort returns a loopback address nothing listens on (connections are refused).
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

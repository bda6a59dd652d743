package service

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/ingestgen"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Benchmarks: 1000-delta batches over 10,000 keys (internal/ingestgen), applied
//   - raw: store.Apply, i.e. one pipelined EVALSHA per delta, no HTTP;
//   - http: POST /v1/sync over loopback HTTP (encode, decode, auth, apply, reply).
// Both report key-deltas/s and the p99 latency of one batch. `go test -run '^$' -bench
// . ./ratelimit/service` runs them against the standalone server and the 6-node
// cluster the package starts.

// runBench applies b.N batches from conc goroutines and reports throughput and the
// batch latency p99 (conc 1: one batch at a time, the latency of a lone gateway worker;
// conc 4: batches queue behind each other, the throughput of a busy fleet).
func runBench(b *testing.B, conc int, apply func(*wire.Batch) error) {
	g := ingestgen.New(fmt.Sprintf("bench-%d", time.Now().UnixNano()), uint64(time.Now().UnixMicro()))
	var mu sync.Mutex
	var lat []time.Duration
	var next atomic.Int64
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
			var mine []time.Duration
			for next.Add(1) <= int64(b.N) {
				bt := g.Batch(rng)
				t0 := time.Now()
				if err := apply(bt); err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if len(lat) == 0 {
		return
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p99 := lat[min(len(lat)-1, len(lat)*99/100)]
	b.ReportMetric(float64(len(lat)*ingestgen.Batch)/elapsed.Seconds(), "deltas/s")
	b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms/batch")
}

// benchModes runs fn for each Redis deployment and concurrency.
func benchModes(b *testing.B, fn func(b *testing.B, in *instance, conc int)) {
	for _, mode := range []store.Mode{store.Standalone, store.Cluster} {
		for _, conc := range []int{1, 4} {
			b.Run(fmt.Sprintf("%s/conc=%d", mode, conc), func(b *testing.B) {
				fn(b, start(b, opts{mode: mode}), conc)
			})
		}
	}
}

func BenchmarkRawBatch(b *testing.B) {
	benchModes(b, func(b *testing.B, in *instance, conc int) {
		ctx := context.Background()
		runBench(b, conc, func(bt *wire.Batch) error {
			_, err := in.st.Apply(ctx, bt, store.Options{Idempotent: true})
			return err
		})
	})
}

func BenchmarkSyncHTTP(b *testing.B) {
	benchModes(b, func(b *testing.B, in *instance, conc int) {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
		runBench(b, conc, func(bt *wire.Batch) error {
			body, err := wire.AppendBatch(nil, bt)
			if err != nil {
				return err
			}
			req, err := http.NewRequest(http.MethodPost, in.http.URL+"/v1/sync", bytes.NewReader(body))
			if err != nil {
				return err
			}
			req.Header.Set("Authorization", "Bearer "+syncSecret)
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			buf, err := readAll(resp.Body, make([]byte, 0, 64<<10))
			resp.Body.Close()
			if err != nil {
				return err
			}
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("status %d: %s", resp.StatusCode, buf)
			}
			var r wire.Reply
			return wire.DecodeReply(buf, &r)
		})
	})
}

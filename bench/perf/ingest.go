package perf

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/internal/ingestgen"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Ingest batches: 1,000 deltas of distinct keys out of 10,000, as one worker of one of
// 8 gateways sends them (internal/ingestgen, the generator of ratelimit/service's
// BenchmarkRawBatch and BenchmarkSyncHTTP too).
const (
	IngestKeys  = ingestgen.Keys
	IngestBatch = ingestgen.Batch
)

// IngestResult is the throughput of one way of applying batches.
type IngestResult struct {
	Path         string // "raw" (store.Apply) or "http" (POST /v1/sync)
	Mode         string // standalone or cluster
	Concurrency  int
	Batches      int64
	DeltasPerSec float64
	P50, P99     time.Duration // per batch
	Redis        RedisWork
}

// RunIngest applies 1,000-delta batches from conc goroutines for d, through the store
// directly (raw: one pipeline of EVALSHA calls of up to 100 deltas per Redis node, no
// HTTP) or through the service's POST /v1/sync over loopback HTTP (encode, decode,
// auth, apply, reply).
// info, when not nil, is the Redis whose INFO measures the work (standalone only).
func RunIngest(svc *Service, info redis.Cmdable, viaHTTP bool, conc int, d time.Duration) (IngestResult, error) {
	r := IngestResult{Path: "raw store.Apply", Mode: string(svc.Mode), Concurrency: conc}
	apply := func(b *wire.Batch) error {
		_, err := svc.Store.Apply(context.Background(), b, store.Options{Idempotent: true})
		return err
	}
	if viaHTTP {
		r.Path = "POST /v1/sync"
		client := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16}}
		defer client.CloseIdleConnections()
		apply = func(b *wire.Batch) error { return postSync(client, svc.URL, b) }
	}
	g := ingestgen.New(fmt.Sprintf("ing%d", time.Now().UnixNano()%1e9), uint64(time.Now().UnixMicro()))
	var (
		mu       sync.Mutex
		lats     []time.Duration
		firstErr error
		stop     atomic.Bool
		wg       sync.WaitGroup
	)
	var in0, in1 RedisInfo
	if info != nil {
		in0, _ = ReadInfo(context.Background(), info)
	}
	start := time.Now()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w)+7, uint64(time.Now().UnixNano())))
			var mine []time.Duration
			for !stop.Load() {
				b := g.Batch(rng)
				t0 := time.Now()
				if err := apply(b); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		}(w)
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start)
	if info != nil {
		in1, _ = ReadInfo(context.Background(), info)
	}
	if firstErr != nil {
		return r, fmt.Errorf("ingest %s: %w", r.Path, firstErr)
	}
	slices.Sort(lats)
	r.Batches = int64(len(lats))
	r.DeltasPerSec = float64(r.Batches*IngestBatch) / elapsed.Seconds()
	r.P50, r.P99 = Percentile(lats, 50), Percentile(lats, 99)
	r.Redis = in1.Since(in0)
	return r, nil
}

// postSync posts one batch to the service's /v1/sync and decodes the reply.
func postSync(client *http.Client, url string, b *wire.Batch) error {
	body, err := wire.AppendBatch(nil, b)
	if err != nil {
		return err
	}
	req, err := http.NewRequest(http.MethodPost, url+"/v1/sync", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+SyncSecret)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	buf, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST /v1/sync: status %d: %s", resp.StatusCode, buf)
	}
	var rep wire.Reply
	return wire.DecodeReply(buf, &rep)
}

package perf

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// AdminPoint is the latency of the admin API's per-key calls with Keys caller keys
// holding buckets in Redis.
type AdminPoint struct {
	Keys                         int
	UsageP50, UsageP99           time.Duration
	ResetP50, ResetP99           time.Duration
	Samples                      int
	FillTime                     time.Duration // writing the keys added at this size
	RedisKeys                    int64         // DBSIZE after the fill
	UsageBuckets, ResetDeleted   int           // what the sampled calls found (sanity)
	ResetBefore                  int           // keys reset at the smaller sizes before
	UsageSampled, ResetSampled   int
	FirstUsageErr, FirstResetErr string
}

// AdminToken is the admin token of the benchmark's service.
const AdminToken = "bench-admin"

// MeasureAdminScale grows the number of caller keys holding a bucket in Redis through
// sizes (ascending) and, at each size, times GET /v1/usage/{key} and POST
// /v1/reset/{key} of samples keys each over the service's HTTP API. Keys are written as
// gateways' acquires are, through store.Apply in batches of 100 deltas (one bucket of
// rule "admin" per key, 100 per minute), so Redis holds what a fleet would. Usage and
// reset name a key's buckets from the rule parameters the service has seen
// (RATIONALE.md §5), so their time must not depend on how many keys there are; a scan
// of the keyspace would grow with it.
func (s *Service) MeasureAdminScale(ctx context.Context, sizes []int, samples int) ([]AdminPoint, error) {
	run := "adm" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	keyOf := func(i int) string { return run + "-" + strconv.Itoa(i) }
	hc := &http.Client{Timeout: 10 * time.Second}
	call := func(method, path string) (int, []byte, time.Duration, error) {
		req, err := http.NewRequestWithContext(ctx, method, s.URL+path, nil)
		if err != nil {
			return 0, nil, 0, err
		}
		req.Header.Set("Authorization", "Bearer "+AdminToken)
		start := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			return 0, nil, 0, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, body, time.Since(start), err
	}
	var out []AdminPoint
	filled := 0
	gone := map[int]bool{} // keys reset at an earlier size
	live := func(i int) int {
		for gone[i] {
			i++
		}
		return i
	}
	for _, n := range sizes {
		p := AdminPoint{Keys: n, ResetBefore: len(gone)}
		start := time.Now()
		for filled < n {
			b := wire.Batch{Node: run + "-gw", Seq: uint64(filled + 1)}
			for ; filled < n && len(b.Deltas) < 100; filled++ {
				b.Deltas = append(b.Deltas, wire.Delta{Key: keyOf(filled), Rule: "admin", Flags: wire.FlagAcquire, Over: 1,
					ElapsedMs: 100, Algo: uint8(algo.TokenBucket), Limit: 100, WindowMs: 60_000})
			}
			if _, err := s.Store.Apply(ctx, &b, store.Options{}); err != nil {
				return out, fmt.Errorf("admin scale: filling %d keys: %w", n, err)
			}
		}
		p.FillTime = time.Since(start)
		if size, err := s.Store.Client().DBSize(ctx).Result(); err == nil {
			p.RedisKeys = size
		}
		// Warm the connection and the handlers, then sample keys spread over the whole
		// range; resets take keys usage did not read, so each reset deletes a live bucket.
		if _, _, _, err := call(http.MethodGet, "/v1/usage/"+url.PathEscape(keyOf(0))); err != nil {
			return out, fmt.Errorf("admin scale: %w", err)
		}
		var usage, reset []time.Duration
		for i := 0; i < samples; i++ {
			k := keyOf(live((i*2 + 1) * (n / (2*samples + 1))))
			status, body, d, err := call(http.MethodGet, "/v1/usage/"+url.PathEscape(k))
			if err != nil || status != http.StatusOK {
				if p.FirstUsageErr == "" {
					p.FirstUsageErr = fmt.Sprintf("%d %v %.100s", status, err, body)
				}
				continue
			}
			var u store.Usage
			if json.Unmarshal(body, &u) == nil {
				p.UsageBuckets += len(u.Buckets)
			}
			usage = append(usage, d)
			j := live((i*2 + 2) * (n / (2*samples + 1)))
			gone[j] = true
			k = keyOf(j)
			status, body, d, err = call(http.MethodPost, "/v1/reset/"+url.PathEscape(k))
			if err != nil || status != http.StatusOK {
				if p.FirstResetErr == "" {
					p.FirstResetErr = fmt.Sprintf("%d %v %.100s", status, err, body)
				}
				continue
			}
			var r struct {
				Deleted int `json:"deleted"`
			}
			if json.Unmarshal(body, &r) == nil {
				p.ResetDeleted += r.Deleted
			}
			reset = append(reset, d)
		}
		p.Samples, p.UsageSampled, p.ResetSampled = samples, len(usage), len(reset)
		p.UsageP50, p.UsageP99 = quantiles(usage)
		p.ResetP50, p.ResetP99 = quantiles(reset)
		out = append(out, p)
	}
	return out, nil
}

// quantiles returns the median and the 99th percentile (nearest rank) of ds.
func quantiles(ds []time.Duration) (p50, p99 time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)/2], s[(len(s)*99+99)/100-1]
}

package perf

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// Shaping (max_delay): how evenly held requests reach the upstream, and whether held
// requests slow the worker for everyone else.

// ShapeConfig is a rule of 100 requests a second, one at once, holding up to 1 s.
var ShapeConfig = []byte(`{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"api","algorithm":"gcra",
	"limit":100,"window":"1s","burst":1,"max_delay":"1s"}]}`)

// ShapeResult is one shaping measurement.
type ShapeResult struct {
	Burst, Through, Refused int
	// Gaps are the intervals between consecutive arrivals at the upstream of the held
	// requests (the rule's spacing is 10 ms).
	GapMean, GapP50, GapMax, GapMin time.Duration
	// OtherIdle and OtherHeld are another caller's mean latency through the same worker
	// with no request held and with the burst's requests held.
	OtherIdle, OtherHeld time.Duration
	OtherRequests        int
}

// MeasureShaping sends a burst of 150 requests at once for one key through one worker
// of filter (the compiled module) and, while they are held, requests of another caller
// one after the other; then the same other-caller requests with nothing held.
func MeasureShaping(filter []byte) (ShapeResult, error) {
	var mu sync.Mutex
	var arrivals []time.Time
	h, err := wazerohost.New(wazerohost.Config{Wasm: filter, PluginConfig: ShapeConfig, Workers: 1, LogLevel: wazerohost.LogWarn,
		Upstream: func(_ context.Context, req *wazerohost.Request) (*wazerohost.Response, error) {
			if req.Get("x-api-key") == "burst" {
				mu.Lock()
				arrivals = append(arrivals, time.Now())
				mu.Unlock()
			}
			return &wazerohost.Response{Status: 200, Body: []byte("ok")}, nil
		}})
	if err != nil {
		return ShapeResult{}, err
	}
	defer h.Close()
	r := ShapeResult{Burst: 150}
	other := func(n int) (time.Duration, error) {
		start := time.Now()
		for i := 0; i < n; i++ {
			if resp := h.Serve(context.Background(), 0, BenchRequest(fmt.Sprintf("other-%d", i%50))); resp.Status != 200 {
				return 0, fmt.Errorf("another caller: status %d", resp.Status)
			}
		}
		return time.Since(start) / time.Duration(n), nil
	}
	if _, err := other(2000); err != nil { // warm-up
		return r, err
	}
	var wg sync.WaitGroup
	statuses := make([]int, r.Burst)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i] = h.Serve(context.Background(), 0, BenchRequest("burst")).Status
		}()
	}
	// While the burst is held (about a second), another caller's requests.
	time.Sleep(50 * time.Millisecond)
	r.OtherRequests = 1000
	if r.OtherHeld, err = other(r.OtherRequests); err != nil {
		return r, err
	}
	wg.Wait()
	if r.OtherIdle, err = other(r.OtherRequests); err != nil {
		return r, err
	}
	for _, s := range statuses {
		switch s {
		case 200:
			r.Through++
		case 429:
			r.Refused++
		}
	}
	sort.Slice(arrivals, func(i, j int) bool { return arrivals[i].Before(arrivals[j]) })
	var gaps []time.Duration
	for i := 2; i < len(arrivals); i++ { // the first went at once: gaps between held ones
		gaps = append(gaps, arrivals[i].Sub(arrivals[i-1]))
	}
	if len(gaps) == 0 {
		return r, fmt.Errorf("no held request reached the upstream (%d through, %d refused)", r.Through, r.Refused)
	}
	sort.Slice(gaps, func(i, j int) bool { return gaps[i] < gaps[j] })
	var sum time.Duration
	for _, g := range gaps {
		sum += g
	}
	r.GapMean, r.GapP50, r.GapMin, r.GapMax = sum/time.Duration(len(gaps)), gaps[len(gaps)/2], gaps[0], gaps[len(gaps)-1]
	return r, nil
}

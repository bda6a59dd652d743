// Package hostdelay measures how late the machine runs a no-op, so that a test asserting
// a product bound in wall-clock time can tell the product's part of a latency from the
// host's scheduling (see Probe).
package hostdelay

import (
	"context"
	"io"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"
)

// Probe is a loop that sleeps a period and then makes one HTTP round trip over loopback to a
// server in this process that answers at once; each iteration's delay is how much longer
// it took than its sleep (timer lateness + the round trip: what scheduling adds to a
// timer and a request, the two things the bounds tests assert are made of). On a quiet
// machine an iteration's delay is well under a millisecond; when the machine is busy —
// other processes on the same cores, a build, a garbage collection in this process,
// which also hosts the wazero gateways — it is what a request or a tick was kept waiting.
//
// A timing assertion then checks measured ≤ bound + Max(from, to): the product bound
// plus the longest delay the host imposed on a no-op during the interval measured, and
// logs both, so a failure names the product and a pass under load says what was allowed.
type Probe struct {
	every time.Duration

	mu      sync.Mutex
	samples []delaySample

	srv    *http.Server
	cancel context.CancelFunc
	done   chan struct{}
}

type delaySample struct {
	start, end time.Time
	delay      time.Duration
}

// Start starts a probe that sleeps every between round trips; Close stops it. Each
// iteration also makes one round trip to each of also (URLs of other processes' no-op
// endpoints, such as a service's /healthz), so that a stall of those processes counts
// too: on a busy machine the scheduler starves some processes and not others. A failed
// round trip (a process stopped on purpose) counts for the time it took.
func Start(every time.Duration, also ...string) (*Probe, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &Probe{every: every, done: make(chan struct{})}
	h.srv = &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})}
	go func() { _ = h.srv.Serve(ln) }()
	url := "http://" + ln.Addr().String() + "/"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() {
		defer close(h.done)
		defer client.CloseIdleConnections()
		for ctx.Err() == nil {
			start := time.Now()
			time.Sleep(every)
			for _, u := range append([]string{url}, also...) {
				rctx, cancel := context.WithTimeout(ctx, time.Second)
				req, _ := http.NewRequestWithContext(rctx, http.MethodGet, u, nil)
				if resp, err := client.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				cancel()
			}
			end := time.Now()
			h.mu.Lock()
			h.samples = append(h.samples, delaySample{start, end, end.Sub(start) - every})
			h.mu.Unlock()
		}
	}()
	return h, nil
}

// Close stops the probe.
func (h *Probe) Close() {
	h.cancel()
	<-h.done
	_ = h.srv.Close()
}

// within returns the delays of the iterations that overlap [from, to], once the probe
// has gone past to (waitPast).
func (h *Probe) within(from, to time.Time) []time.Duration {
	h.waitPast(to)
	h.mu.Lock()
	defer h.mu.Unlock()
	i := sort.Search(len(h.samples), func(i int) bool { return !h.samples[i].end.Before(from) })
	var out []time.Duration
	for ; i < len(h.samples) && !h.samples[i].start.After(to); i++ {
		out = append(out, h.samples[i].delay)
	}
	return out
}

// waitPast returns once an iteration has ended after t, the probe has stopped, or two
// seconds have passed. An iteration the host stalled while an interval ended is still
// running when the caller, stalled by the same host, reads the probe, and would be
// missed: read at once, a trial whose degraded marker came 337 ms after the stop saw a
// longest stall of 143 ms while its summed stalls, read a moment before, saw 12.
func (h *Probe) waitPast(t time.Time) {
	deadline := time.After(2 * time.Second)
	for {
		h.mu.Lock()
		past := len(h.samples) > 0 && h.samples[len(h.samples)-1].end.After(t)
		h.mu.Unlock()
		if past {
			return
		}
		select {
		case <-h.done:
			return
		case <-deadline:
			return
		case <-time.After(h.every / 2):
		}
	}
}

// Max is the longest delay of an iteration overlapping [from, to] (0 when none ran).
func (h *Probe) Max(from, to time.Time) time.Duration {
	var m time.Duration
	for _, d := range h.within(from, to) {
		m = max(m, d)
	}
	return m
}

// Quantile is the q-quantile (nearest rank) of the delays of the iterations overlapping
// [from, to] (0 when none ran).
func (h *Probe) Quantile(q float64, from, to time.Time) time.Duration {
	ds := h.within(from, to)
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	i := int(q*float64(len(ds)) + 0.999999)
	return ds[min(max(i-1, 0), len(ds)-1)]
}

// Stalled is how long the host kept the probe waiting during [from, to] beyond its usual:
// the sum, over the iterations overlapping the interval, of each delay above the median
// delay of every iteration so far. The iterations run one after another, so the sum is
// the time the host took from a no-op in the interval; Max sees only the longest stall,
// and a latency that several stalls of one interval each pushed back is late by all of
// them (the degraded marker once came 424 ms after a stop in a trial whose longest stall
// was 148 ms and whose stalls summed to more). On a quiet machine every delay is near the
// median and Stalled is near zero.
func (h *Probe) Stalled(from, to time.Time) time.Duration {
	in := h.within(from, to) // first: the median then counts the iteration waited for
	h.mu.Lock()
	all := make([]time.Duration, len(h.samples))
	for i, s := range h.samples {
		all[i] = s.delay
	}
	h.mu.Unlock()
	if len(all) == 0 {
		return 0
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	usual := all[(len(all)-1)/2]
	var sum time.Duration
	for _, d := range in {
		sum += max(0, d-usual)
	}
	return sum
}

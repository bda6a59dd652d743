//go:build !wasip1

package main

import (
	"context"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/bench/perf"
	"github.com/tollgate-rl/tollgate/filter/plugin"
	"github.com/tollgate-rl/tollgate/filter/wasmtest"
	"github.com/tollgate-rl/tollgate/internal/envoyproc"
	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
)

// The garbage-collection soak in real Envoy: the module built with tollgate_gcprobe
// (gcprobe.go: every 2,000 requests a VM serves it makes 4 MiB of garbage, every
// 20,000 it forces a collection, and it publishes what happened as stats) serves
// soakRequests requests through each release's Envoy, run from the shipped envoy.yaml
// (addresses, ports and paths substituted) on envoy.wasm.runtime.v8 with two workers,
// with the real sync service on a real Redis. The sync stays on: its callouts, their
// answers copied into the VM (proxy_on_memory_allocate) and the ticks are where the
// module allocates on its own, so they must meet collections as in the field.
//
// Memory is flat when, from the first sample after soakSettled requests (and a fifth of
// the run) to the end, three things hold. Each VM's live heap (what the module keeps,
// measured right after a forced collection) grows by at most soakLiveGrowth: a leak
// shows there first. Each VM's memory (what Go's runtime has mapped: a wasm memory only
// grows, so this is the linear memory's high-water mark) has no trend: its peak over the
// second half of the settled samples is at most soakVMGrowth above its peak over the
// first half. A high-water mark rises in steps whenever a 4 MiB burst of the soak's
// garbage happens to meet a collection in progress (one such step of 1.75 MiB was seen
// between the settled sample and the end with the live heap flat), so its growth from
// the settled sample alone measures luck, not a leak; a leak raises every later peak.
// And Envoy's resident memory grows by at most soakRSSGrowth of itself. Until the
// settled sample memory grows as it should: every key's bucket is made, V8 tiers the
// module up, and each VM's Go heap grows to what the soak's garbage makes it need
// (about 15 MB).
const (
	soakSamples  = 10
	soakSettled  = 25_000
	soakVMGrowth = 1 << 20
	// soakLiveGrowth bounds the live heap's growth (about 4.3 MiB in the soak).
	soakLiveGrowth = 512 << 10
	soakRSSGrowth  = 0.05
	soakConns      = 8
)

func TestEnvoySoak(t *testing.T) {
	n := soakRequests(t)
	wasm := wasmtest.BuildWasmTags(t, "./filter", "tollgate_gcprobe")
	srv, err := redistest.Launch(redistest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	svc, err := perf.StartService(store.Standalone, srv.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	backend, stop, err := envoyproc.Upstream()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for _, rel := range envoyproc.Releases {
		t.Run(rel, func(t *testing.T) { envoySoak(t, rel, wasm, backend, svc.Addr, n) })
	}
}

// soakSample is the state after some requests.
type soakSample struct {
	requests int
	rss      int64
	vmMem    map[string]uint64 // per VM (tollgate_test.vm_<id>.memory_bytes)
	vmLive   map[string]uint64 // per VM, the live heap after its last forced collection
}

func envoySoak(t *testing.T, rel string, wasm []byte, backend, sync string, n int) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	e, err := perf.StartEnvoy(ctx, t.TempDir(), perf.EnvoyOptions{Release: rel, Wasm: wasm, Backend: backend, Sync: sync, LogLevel: "info"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	stats := func() map[string]uint64 {
		s, err := e.Stats(ctx)
		if err != nil {
			t.Fatalf("stats: %v", err)
		}
		return s
	}
	created0 := stats()["wasm.envoy.wasm.runtime.v8.created"]
	paths := []string{"/orders", "/search?q=x", "/users/7", "/login"}
	// GET only: /login's rule (POST, strict: a synchronous check per request, failing
	// closed) stays out, so every answer is a decision from the buckets and their leases.
	// 4,000 keys within their limits, and every 50th request one key far over its
	// limit (/search: 30 a minute), so that refusals, with their headers and penalties,
	// meet collections too.
	req := func(i int) *http.Request {
		path, key := paths[i%len(paths)], rel+"-k"+strconv.Itoa(i*7919%4000)
		if i%50 == 0 {
			path, key = "/search?q=hot", rel+"-hot"
		}
		r, _ := http.NewRequest(http.MethodGet, path, nil)
		r.Header.Set("x-api-key", key)
		return r
	}
	status := map[int]int{}
	var samples []soakSample
	began := time.Now()
	for s := 1; s <= soakSamples; s++ {
		chunk := n * s / soakSamples
		prev := n * (s - 1) / soakSamples
		st, err := perf.Drive(ctx, e.URL, chunk-prev, soakConns, 0, func(i int) *http.Request { return req(prev + i) })
		for k, v := range st {
			status[k] += v
		}
		if err != nil {
			t.Fatalf("after %d requests: %v\nthe filter's stats: %s\n%s", prev, err, filterStats(stats()), e.LogTail(20))
		}
		p, err := perf.ReadProc(e.Pid())
		if err != nil {
			t.Fatal(err)
		}
		sm := soakSample{requests: chunk, rss: p.RSS, vmMem: map[string]uint64{}, vmLive: map[string]uint64{}}
		for k, v := range stats() {
			if vm, ok := strings.CutSuffix(k, ".heap_live_bytes"); ok && strings.HasPrefix(k, "wasmcustom.tollgate_test.vm_") {
				sm.vmLive[vm] = v
			} else if strings.HasPrefix(k, "wasmcustom.tollgate_test.vm_") && strings.HasSuffix(k, ".memory_bytes") {
				sm.vmMem[k] = v
			}
		}
		samples = append(samples, sm)
	}
	elapsed := time.Since(began)
	// The filter hands its counts to Envoy on its tick: wait one before the last read.
	time.Sleep((plugin.MetricsFlushMs + 100) * time.Millisecond)
	end := stats()

	// Collections ran in the VMs: the forced ones (each VM forces one per 20,000 of its
	// requests, as forceGCEvery in the soak on the project's host) and the allocator's own on top.
	cycles, forced := end["wasmcustom.tollgate_test.gc_cycles"], end["wasmcustom.tollgate_test.gc_forced"]
	t.Logf("Envoy %s: %d requests in %v (%.0f/s), statuses %v, %d GC cycles (%d forced), VMs created %d, active %d",
		rel, n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), status, cycles, forced,
		end["wasm.envoy.wasm.runtime.v8.created"], end["wasm.envoy.wasm.runtime.v8.active"])
	// A callout the proxy never answered is settled by the plugin (degraded, after
	// twice its timeout); the soak reports how often, per release.
	t.Logf("Envoy %s: checks failed %d, of them lost (never answered by the proxy) %d; trace %s", rel,
		end["wasmcustom.tollgate.checks_failed"], end["wasmcustom.tollgate.checks_lost"], filterStats(traceStats(end)))
	if want := uint64(n/forceGCEvery) - 2; n >= 3*forceGCEvery && forced < want {
		t.Errorf("%d forced collections, want at least %d", forced, want)
	}
	if cycles <= forced {
		t.Errorf("%d GC cycles, %d forced: want collections of the allocator's own too", cycles, forced)
	}

	// No VM failed: no failure in the log, no VM created after start, and every request
	// decided by the filter (a failed VM under FAIL_OPEN lets requests pass undecided).
	if lines := e.VMFailureLines(); len(lines) > 0 {
		t.Errorf("VM failures in Envoy's log:\n%s", strings.Join(lines, "\n"))
	}
	if c := end["wasm.envoy.wasm.runtime.v8.created"]; c != created0 {
		t.Errorf("V8 VMs created: %d at start, %d at the end", created0, c)
	}
	decided := end["wasmcustom.tollgate.requests_allowed"] + end["wasmcustom.tollgate.requests_rejected"]
	if decided != uint64(n) || status[200]+status[429] != n || status[200] == 0 || status[429] == 0 {
		t.Errorf("decided %d of %d requests; statuses %v: want every request decided, a mix of 200 and 429 only", decided, n, status)
	}

	// Flat memory from the settled sample on.
	settled, last := samples[len(samples)-1], samples[len(samples)-1]
	for _, s := range samples {
		if s.requests >= max(soakSettled, n/5) {
			settled = s
			break
		}
	}
	var series []string
	for _, s := range samples {
		series = append(series, strconv.FormatInt(s.rss>>20, 10))
	}
	t.Logf("Envoy RSS (MiB) after each tenth: %s", strings.Join(series, " "))
	if grow := float64(last.rss-settled.rss) / float64(settled.rss); grow > soakRSSGrowth {
		t.Errorf("Envoy's RSS grew %.1f %% (%d → %d MiB) after %d requests, want at most %.0f %%",
			100*grow, settled.rss>>20, last.rss>>20, settled.requests, 100*soakRSSGrowth)
	}
	vms := make([]string, 0, len(last.vmMem))
	for k := range last.vmMem {
		vms = append(vms, k)
	}
	sort.Strings(vms)
	if len(vms) == 0 {
		t.Error("no VM published its memory")
	}
	for _, k := range vms {
		var ser []string
		for _, s := range samples {
			ser = append(ser, strconv.FormatUint(s.vmMem[k]>>10, 10))
		}
		var live []string
		for _, s := range samples {
			live = append(live, strconv.FormatUint(s.vmLive[strings.TrimSuffix(k, ".memory_bytes")]>>10, 10))
		}
		t.Logf("%s (KiB) after each tenth: %s; live heap after the last forced collection: %s", strings.TrimPrefix(k, "wasmcustom.tollgate_test."),
			strings.Join(ser, " "), strings.Join(live, " "))
		var after []soakSample
		for _, s := range samples {
			if s.requests >= settled.requests {
				after = append(after, s)
			}
		}
		peak := func(ss []soakSample) (m uint64) {
			for _, s := range ss {
				m = max(m, s.vmMem[k])
			}
			return m
		}
		half := len(after) / 2
		if a, b := peak(after[:half]), peak(after[half:]); a == 0 || b > a+soakVMGrowth {
			t.Errorf("%s: peak %d bytes over the first half of the settled samples, %d over the second: want at most %d more",
				k, a, b, soakVMGrowth)
		}
		// The live heap is known from a VM's first forced collection on.
		vm := strings.TrimSuffix(k, ".memory_bytes")
		var first soakSample
		for _, s := range after {
			if s.vmLive[vm] != 0 {
				first = s
				break
			}
		}
		if a, b := first.vmLive[vm], last.vmLive[vm]; a == 0 {
			t.Errorf("%s: no live heap published after %d requests", vm, settled.requests)
		} else if b > a+soakLiveGrowth {
			t.Errorf("%s: live heap %d bytes after %d requests, %d at the end: want at most %d more", vm, a, first.requests, b, soakLiveGrowth)
		}
	}
}

// filterStats lists the filter's own stats (wasmcustom.tollgate.*), for a failure's
// message: what the VMs were doing when a request went unanswered.
func filterStats(all map[string]uint64) string {
	var out []string
	for k, v := range all {
		if name, ok := strings.CutPrefix(k, "wasmcustom."); ok && v != 0 {
			out = append(out, name+"="+strconv.FormatUint(v, 10))
		}
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// traceStats keeps the soak build's request-path trace (gcprobe.go).
func traceStats(all map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range all {
		if strings.HasPrefix(k, "wasmcustom.tollgate_test.trace.") {
			out[k] = v
		}
	}
	return out
}

//go:build !wasip1

package main

import (
	"context"
	"errors"
	"hash/fnv"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetratelabs/wazero/api"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
	"github.com/tollgate-rl/tollgate/filter/wasmtest"
	wasmhost "github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// The compatibility soak on the project's host: the shipped module (with the test-only
// tollgate_gcprobe export) serves the same request sequence under host modes, with
// garbage collections inside the VM, and must decide every request the same way
// everywhere, never fail, and never hand poll_oneoff to the host. Envoy 1.33–1.38 and
// the newest releases are soaked in real Envoy (envoysoak_test.go: 1.36.2 and 1.40.0);
// what stays here is what no served Envoy release reproduces: the WASI of Envoy before
// 1.33 (WASILegacy), a deterministic clock, so decisions can be compared bit for bit
// with the full WASI host's, and the count of poll_oneoff calls reaching the host.

const soakConfig = `{"key":{"source":"header","name":"x-api-key"},"rules":[
	{"id":"api","limit":600,"window":"1m"},
	{"id":"search","match":{"prefix":"/search"},"limit":20,"window":"1s"},
	{"id":"login","match":{"prefix":"/login"},"algorithm":"gcra","limit":5,"window":"10s"}]}`

// soakRequests is the number of requests per mode: TOLLGATE_SOAK_REQUESTS if set
// (make bench sets 1,000,000), else 100,000, or 30,000 with -short. The soak on the
// project's host and the one through Envoy (envoysoak_test.go) both take it.
func soakRequests(t *testing.T) int {
	if s := os.Getenv("TOLLGATE_SOAK_REQUESTS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("TOLLGATE_SOAK_REQUESTS=%q", s)
		}
		return n
	}
	if testing.Short() {
		return 30_000
	}
	return 100_000
}

// soakResult is what one mode's run decided and observed.
type soakResult struct {
	decisions      uint64 // FNV-1a over every answer's status and remaining count
	status         map[int]int
	gcStart, gcEnd uint32 // completed collections before and after the run
	forced         int
	pollOneoff     int64
	vmFailures     int64
	err            error
}

// forceGCEvery forces a collection this often, so collections happen however little the
// request path allocates; the ones the allocator triggers on its own come on top.
const forceGCEvery = 20_000

func runSoak(wasm []byte, mode wasmhost.WASIMode, n int) soakResult {
	res := soakResult{status: map[int]int{}}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	now := start
	h, err := wasmhost.New(wasmhost.Config{
		Wasm:         wasm,
		WASI:         mode,
		PluginConfig: []byte(soakConfig),
		LogLevel:     2,
		Clock: func() time.Time {
			mu.Lock()
			defer mu.Unlock()
			return now
		},
	})
	if err != nil {
		res.err = err
		return res
	}
	defer h.Close()
	gc := func(force uint32) (uint32, error) {
		var c uint32
		var err error
		h.CallOnVM(0, func(ctx context.Context, mod api.Module) {
			fn := mod.ExportedFunction("tollgate_test_gc")
			if fn == nil {
				err = errors.New("module lacks the tollgate_test_gc export (built without tollgate_gcprobe?)")
				return
			}
			var r []uint64
			if r, err = fn.Call(ctx, uint64(force)); err == nil {
				c = api.DecodeU32(r[0])
			}
		})
		return c, err
	}
	if res.gcStart, res.err = gc(0); res.err != nil {
		return res
	}
	paths := []string{"/orders", "/search?q=x", "/login", "/users/7"}
	upstream := &wasmhost.Response{Status: 200}
	sum := fnv.New64a()
	var line []byte
	for i := 0; i < n; i++ {
		mu.Lock()
		now = now.Add(250 * time.Microsecond)
		mu.Unlock()
		req := &wasmhost.Request{Method: "GET", Path: paths[i%len(paths)], Authority: "api",
			Header:     []wasmhost.Pair{{"x-api-key", "k" + strconv.Itoa(i*7919%4000)}},
			RemoteAddr: "10.0.0.1:4000"}
		resp, err := h.Exchange(0, req, upstream)
		if err != nil {
			res.err = err
			break
		}
		res.status[resp.Status]++
		line = strconv.AppendInt(line[:0], int64(resp.Status), 10)
		line = append(line, ' ')
		line = append(line, resp.Get("x-ratelimit-remaining")...)
		line = append(line, '\n')
		sum.Write(line)
		if (i+1)%(forceGCEvery/10) == 0 { // garbage, as a module that allocates makes
			if _, err := gc(2); err != nil {
				res.err = err
				break
			}
		}
		if (i+1)%forceGCEvery == 0 {
			if _, err := gc(1); err != nil {
				res.err = err
				break
			}
			res.forced++
		}
	}
	res.decisions = sum.Sum64()
	if res.err == nil {
		res.gcEnd, res.err = gc(0)
	}
	st := h.Stats()
	res.pollOneoff, res.vmFailures = st.PollOneoff, st.VMFailures
	return res
}

// The shipped module under the full WASI host and Envoy-before-1.33's: no VM failure, no
// poll_oneoff at the host, collections seen inside the VM, and the same decisions under
// both. make test runs 100,000 requests per mode; make bench runs 1,000,000
// (soakRequests).
func TestCompatSoak(t *testing.T) {
	n := soakRequests(t)
	wasm := wasmtest.BuildWasmTags(t, "./filter", "tollgate_gcprobe")
	modes := []wasmhost.WASIMode{wasmhost.WASIFull, wasmhost.WASILegacy}
	results := make([]soakResult, len(modes))
	var wg sync.WaitGroup
	began := time.Now()
	for i, m := range modes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = runSoak(wasm, m, n)
		}()
	}
	wg.Wait()
	for i, m := range modes {
		r := results[i]
		natural := int(r.gcEnd-r.gcStart) - r.forced
		t.Logf("%s: %d requests, statuses %v, %d GC cycles (%d forced, %d on their own), poll_oneoff at host %d, VM failures %d, decisions %016x",
			m, n, r.status, r.gcEnd-r.gcStart, r.forced, natural, r.pollOneoff, r.vmFailures, r.decisions)
		if r.err != nil {
			t.Errorf("%s: %v", m, r.err)
			continue
		}
		if r.vmFailures != 0 || r.pollOneoff != 0 {
			t.Errorf("%s: %d VM failures, %d poll_oneoff calls reached the host; want none", m, r.vmFailures, r.pollOneoff)
		}
		if want := n / forceGCEvery; int(r.gcEnd-r.gcStart) < want {
			t.Errorf("%s: %d GC cycles, want at least the %d forced", m, r.gcEnd-r.gcStart, want)
		}
		if r.status[200] == 0 || r.status[429] == 0 || r.status[200]+r.status[429] != n {
			t.Errorf("%s: statuses %v; want a mix of 200 and 429 only", m, r.status)
		}
		if r.decisions != results[0].decisions {
			t.Errorf("%s decided differently from %s (%016x vs %016x)", m, modes[0], r.decisions, results[0].decisions)
		}
	}
	t.Logf("%d modes x %d requests in %v", len(modes), n, time.Since(began).Round(time.Millisecond))
}

// The module as the Go toolchain builds it, without the shim, fails where those Envoys
// failed: it does not load on an Envoy before 1.33, and on 1.33–1.38 the first garbage
// collection hands poll_oneoff to the host, gets ENOSYS and the runtime aborts. This is
// what the soak above would catch if the shim stopped doing its job.
func TestCompatToolchainModuleFails(t *testing.T) {
	raw, err := wasmbuild.GoBuild("./filter", "tollgate_gcprobe")
	if err != nil {
		t.Fatal(err)
	}
	_, err = wasmhost.New(wasmhost.Config{Wasm: raw, WASI: wasmhost.WASILegacy, PluginConfig: []byte(soakConfig)})
	if err == nil || !strings.Contains(err.Error(), "does not offer") {
		t.Errorf("Envoy before 1.33: New = %v, want a refusal to load (missing WASI import)", err)
	}

	r := runSoak(raw, wasmhost.WASIEnvoy133, 2*forceGCEvery)
	t.Logf("Envoy 1.33-1.38, toolchain module: err %v, poll_oneoff at host %d, statuses %v", r.err, r.pollOneoff, r.status)
	if r.err == nil || r.pollOneoff == 0 {
		t.Errorf("want the VM to abort on poll_oneoff during a collection; err %v, poll_oneoff calls %d", r.err, r.pollOneoff)
	}
}

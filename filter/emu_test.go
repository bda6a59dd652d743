package main

import (
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/tollgate-rl/tollgate/filter/wasmtest"
)

// These tests drive the compiled build of ./filter through the SDK's Envoy emulator
// (proxytest). The emulator only runs _start, so they load a copy with a test-only _start
// alias; the module we ship is unmodified. The emulator has one VM and global state: no
// t.Parallel here.

var (
	aliasOnce sync.Once
	aliasWasm []byte
	aliasErr  error
)

func filterModule(t *testing.T) []byte {
	t.Helper()
	wasm := wasmtest.EmulatorWasm(t, "./filter")
	aliasOnce.Do(func() { aliasWasm, aliasErr = wasmtest.WithStartAlias(wasm) })
	if aliasErr != nil {
		t.Fatalf("alias _start: %v", aliasErr)
	}
	return aliasWasm
}

type emu struct {
	t     *testing.T
	vm    proxytest.WasmVMContext
	host  proxytest.HostEmulator
	reset func()
}

// startEmu loads a fresh VM (nothing carries over between tests) with config, and fails
// the test if the plugin refuses it.
func startEmu(t *testing.T, config string, props ...[2]string) *emu {
	t.Helper()
	e := newEmu(t, config, props...)
	if st := e.host.StartPlugin(); st != types.OnPluginStartStatusOK {
		t.Fatalf("plugin refused its configuration: %v", e.host.GetCriticalLogs())
	}
	return e
}

func newEmu(t *testing.T, config string, props ...[2]string) *emu {
	t.Helper()
	vm, err := proxytest.NewWasmVMContext(filterModule(t))
	if err != nil {
		t.Fatal(err)
	}
	e := &emu{t: t, vm: vm}
	e.open(config, props...)
	t.Cleanup(func() {
		e.reset()
		_ = vm.Close()
	})
	return e
}

// open (re)creates the emulated host around the same VM: the module keeps its memory,
// as Envoy's VM does when it pushes a new plugin configuration.
func (e *emu) open(config string, props ...[2]string) {
	opt := proxytest.NewEmulatorOption().WithVMContext(e.vm).WithPluginConfiguration([]byte(config))
	for _, p := range props {
		opt = opt.WithProperty(strings.Split(p[0], "."), []byte(p[1]))
	}
	host, release := proxytest.NewHostEmulator(opt)
	var once sync.Once
	e.host, e.reset = host, func() { once.Do(release) }
}

type answer struct {
	status  int
	headers [][2]string
	body    string
	paused  bool
	id      uint32
}

func (a *answer) get(name string) string {
	for _, kv := range a.headers {
		if kv[0] == name {
			return kv[1]
		}
	}
	return ""
}

func (a *answer) has(name string) bool {
	for _, kv := range a.headers {
		if kv[0] == name {
			return true
		}
	}
	return false
}

// do sends one request through the filter and, unless it answered locally or paused,
// a 200 from the upstream back through it.
func (e *emu) do(path string, hdrs ...string) answer {
	e.t.Helper()
	req := [][2]string{{":method", "GET"}, {":path", path}, {":authority", "api.example.com"}}
	for i := 0; i+1 < len(hdrs); i += 2 {
		req = append(req, [2]string{hdrs[i], hdrs[i+1]})
	}
	id := e.host.InitializeHttpContext()
	act := e.host.CallOnRequestHeaders(id, req, false)
	if lr := e.host.GetSentLocalResponse(id); lr != nil {
		e.host.CompleteHttpContext(id)
		return answer{status: int(lr.StatusCode), headers: lr.Headers, body: string(lr.Data), id: id}
	}
	if act == types.ActionPause {
		return answer{paused: true, id: id}
	}
	return e.finish(id)
}

// finish runs the upstream's response through a stream that was let through.
func (e *emu) finish(id uint32) answer {
	e.host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
	a := answer{status: 200, headers: e.host.GetCurrentResponseHeaders(id), id: id}
	e.host.CompleteHttpContext(id)
	return a
}

// counter reads one of the filter's counters after a tick: the filter hands its counts
// to the host on its tick (plugin.MetricsFlushMs).
func (e *emu) counter(name string) uint64 {
	e.t.Helper()
	e.host.Tick()
	v, err := e.host.GetCounterMetric("tollgate." + name)
	if err != nil {
		e.t.Fatalf("metric %s: %v", name, err)
	}
	return v
}

// count runs n requests and tallies statuses; every answer must carry the headers.
func (e *emu) count(n int, path string, hdrs ...string) map[int]int {
	e.t.Helper()
	got := map[int]int{}
	for i := 0; i < n; i++ {
		a := e.do(path, hdrs...)
		got[a.status]++
		if (a.status == 200 || a.status == 429) && !a.has("x-ratelimit-limit") {
			e.t.Fatalf("request %d (%d) has no x-ratelimit-limit: %v", i, a.status, a.headers)
		}
	}
	return got
}

func itoa(n int) string { return strconv.Itoa(n) }

func b64url(s string) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	var out []byte
	b := []byte(s)
	for i := 0; i < len(b); i += 3 {
		var v uint32
		n := len(b) - i
		if n > 3 {
			n = 3
		}
		for j := 0; j < 3; j++ {
			v <<= 8
			if j < n {
				v |= uint32(b[i+j])
			}
		}
		for j := 0; j < n+1; j++ {
			out = append(out, alphabet[(v>>(18-6*j))&63])
		}
	}
	return string(out)
}

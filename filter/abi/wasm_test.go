package abi_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/tetratelabs/wazero/api"

	"github.com/tollgate-rl/tollgate/filter/wasmtest"
	wasmhost "github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// These tests run against compiled modules: the two benchmark modules and a probe
// module (testdata/probe) that exercises the rest of the binding.
var modules = []struct{ name, pkg string }{
	{"empty", "./filter/bench/empty"},
	{"floor", "./filter/bench/floor"},
	{"probe", "./filter/abi/testdata/probe"},
}

// TestModuleSignatures checks every import and export against the spec: only i32
// values except the spec's i64 ones (wasmtest.I64Allowed), host imports and callbacks
// with their exact v0.2.1 signatures.
func TestModuleSignatures(t *testing.T) {
	for _, m := range modules {
		t.Run(m.name, func(t *testing.T) {
			wasmtest.CheckABI(t, wasmtest.BuildWasm(t, m.pkg))
		})
	}
}

// TestStartupWASICalls keeps the binding free of WASI calls at start-up that older
// Envoys refuse (wasmtest.StartupAllowed).
func TestStartupWASICalls(t *testing.T) {
	for _, m := range modules {
		t.Run(m.name, func(t *testing.T) {
			wasmtest.CheckStartup(t, wasmtest.BuildWasm(t, m.pkg))
		})
	}
}

// newEmulator loads a module into the SDK's emulator (through the test-only _start
// alias). The emulator keeps global state: callers must not run in parallel and must
// call the returned reset.
func newEmulator(t *testing.T, vm types.VMContext, opt *proxytest.EmulatorOption) (proxytest.HostEmulator, func()) {
	t.Helper()
	host, reset := proxytest.NewHostEmulator(opt.WithVMContext(vm))
	if host.StartVM() != types.OnVMStartStatusOK {
		reset()
		t.Fatal("OnVMStart failed")
	}
	return host, reset
}

func loadVM(t *testing.T, pkg string) proxytest.WasmVMContext {
	t.Helper()
	aliased, err := wasmtest.WithStartAlias(wasmtest.EmulatorWasm(t, pkg))
	if err != nil {
		t.Fatal(err)
	}
	vm, err := proxytest.NewWasmVMContext(aliased)
	if err != nil {
		t.Fatalf("loading %s into proxytest: %v", pkg, err)
	}
	t.Cleanup(func() { vm.Close() })
	return vm
}

func header(h [][2]string, name string) (string, bool) {
	for _, kv := range h {
		if strings.EqualFold(kv[0], name) {
			return kv[1], true
		}
	}
	return "", false
}

var requestHeaders = [][2]string{
	{":method", "GET"}, {":path", "/search"}, {":authority", "api"}, {"x-api-key", "sk_live_1"},
}

func TestFloorThroughProxytest(t *testing.T) {
	vm := loadVM(t, "./filter/bench/floor")
	host, reset := newEmulator(t, vm, proxytest.NewEmulatorOption())
	defer reset()
	if host.StartPlugin() != types.OnPluginStartStatusOK {
		t.Fatal("OnPluginStart failed")
	}

	// Many requests: a buffer pinned and never released would show in the gauge.
	const requests = 2000
	for i := 0; i < requests; i++ {
		id := host.InitializeHttpContext()
		if a := host.CallOnRequestHeaders(id, requestHeaders, false); a != types.ActionContinue {
			t.Fatalf("request %d: on_request_headers = %v, want Continue", i, a)
		}
		if a := host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false); a != types.ActionContinue {
			t.Fatalf("request %d: on_response_headers = %v, want Continue", i, a)
		}
		if i == 0 {
			got := host.GetCurrentResponseHeaders(id)
			for _, name := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit"} {
				if _, ok := header(got, name); !ok {
					t.Errorf("response lacks %s: %v", name, got)
				}
			}
		}
		host.CompleteHttpContext(id)
	}
	if logs := host.GetErrorLogs(); len(logs) > 0 {
		t.Fatalf("floor reported host call failures (first of %d): %s", len(logs), logs[0])
	}

	host.Tick()
	pinned, err := host.GetGaugeMetric("floor.pinned_buffers")
	if err != nil {
		t.Fatal(err)
	}
	if pinned != 0 {
		t.Errorf("%d buffers still pinned after %d requests, want 0", pinned, requests)
	}
	// The emulator ends a stream with proxy_on_log and proxy_on_delete, never
	// proxy_on_done, where the binding forgets it; so every stream is still tracked: the
	// count shows one stream per request (and that none was dropped early).
	streams, err := host.GetGaugeMetric("floor.streams")
	if err != nil {
		t.Fatal(err)
	}
	if streams != requests {
		t.Errorf("binding tracks %d streams, want %d (one per request)", streams, requests)
	}
}

func TestProbeThroughProxytest(t *testing.T) {
	vm := loadVM(t, "./filter/abi/testdata/probe")

	start := func(t *testing.T, opt *proxytest.EmulatorOption) proxytest.HostEmulator {
		t.Helper()
		host, reset := newEmulator(t, vm, opt.WithPluginConfiguration([]byte("cfg-1")))
		t.Cleanup(reset)
		if host.StartPlugin() != types.OnPluginStartStatusOK {
			t.Fatal("OnPluginStart failed")
		}
		return host
	}
	request := func(host proxytest.HostEmulator, mode string) (uint32, types.Action) {
		id := host.InitializeHttpContext()
		h := append(slices.Clone(requestHeaders), [2]string{"x-probe", mode})
		return id, host.CallOnRequestHeaders(id, h, false)
	}
	hasLog := func(logs []string, sub string) bool {
		return slices.ContainsFunc(logs, func(l string) bool { return strings.Contains(l, sub) })
	}
	noErrors := func(t *testing.T, host proxytest.HostEmulator) {
		t.Helper()
		if logs := host.GetErrorLogs(); len(logs) > 0 {
			t.Errorf("error logs: %q", logs)
		}
	}

	t.Run("plugin config reaches OnPluginStart", func(t *testing.T) {
		host := start(t, proxytest.NewEmulatorOption())
		if !hasLog(host.GetInfoLogs(), "probe: config=cfg-1") {
			t.Errorf("config not logged: %q", host.GetInfoLogs())
		}
	})
	t.Run("rejected config fails OnPluginStart", func(t *testing.T) {
		host, reset := newEmulator(t, vm, proxytest.NewEmulatorOption().WithPluginConfiguration([]byte("reject")))
		defer reset()
		if host.StartPlugin() != types.OnPluginStartStatusFailed {
			t.Error("OnPluginStart accepted a config the plugin rejected")
		}
	})
	t.Run("headers read and response header replaced", func(t *testing.T) {
		host := start(t, proxytest.NewEmulatorOption())
		id, action := request(host, "plain")
		if action != types.ActionContinue {
			t.Fatalf("action %v, want Continue", action)
		}
		host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}, {"server", "x"}}, false)
		if v, _ := header(host.GetCurrentResponseHeaders(id), "x-probe-seen"); v != "2" {
			t.Errorf("x-probe-seen = %q, want 2 (response headers read back)", v)
		}
		noErrors(t, host)
	})
	t.Run("local reply", func(t *testing.T) {
		host := start(t, proxytest.NewEmulatorOption())
		id, action := request(host, "reply")
		if action != types.ActionPause {
			t.Fatalf("action %v, want Pause", action)
		}
		r := host.GetSentLocalResponse(id)
		if r == nil {
			t.Fatal("no local response sent")
		}
		if r.StatusCode != 429 || r.StatusCodeDetail != "tollgate_rate_limited" || string(r.Data) != `{"error":"slow down"}` || r.GRPCStatus != -1 {
			t.Errorf("local response %+v", r)
		}
		if v, _ := header(r.Headers, "retry-after"); v != "7" {
			t.Errorf("retry-after = %q, want 7 (headers %v)", v, r.Headers)
		}
		noErrors(t, host)
	})
	t.Run("panic is recovered and the VM keeps serving", func(t *testing.T) {
		host := start(t, proxytest.NewEmulatorOption())
		_, action := request(host, "panic")
		if action != types.ActionContinue {
			t.Errorf("action after panic %v, want Continue", action)
		}
		if !hasLog(host.GetCriticalLogs(), "recovered panic in proxy_on_request_headers") {
			t.Errorf("panic not logged at critical: %q", host.GetCriticalLogs())
		}
		// The log names where: the probe's nil map write, with file and line (the
		// shipped build keeps the runtime's line tables).
		if !hasLog(host.GetCriticalLogs(), "testdata/probe/main.go:79)") {
			t.Errorf("panic log does not name the panicking line, testdata/probe/main.go:79: %q", host.GetCriticalLogs())
		}
		id, action := request(host, "plain")
		if action != types.ActionContinue {
			t.Errorf("next request action %v, want Continue", action)
		}
		host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
		if _, ok := header(host.GetCurrentResponseHeaders(id), "x-probe-seen"); !ok {
			t.Error("VM stopped answering after a recovered panic")
		}
	})
	for _, tc := range []struct {
		name        string
		respHeaders [][2]string
		body        string
		wantAction  types.Action
		wantReply   uint32
	}{
		{"stream callout answered 200 resumes the request", [][2]string{{":status", "200"}}, "ok", types.ActionContinue, 0},
		{"stream callout failure answers locally", nil, "", types.ActionPause, 503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := start(t, proxytest.NewEmulatorOption())
			id, action := request(host, "callout")
			if action != types.ActionPause {
				t.Fatalf("action %v, want Pause", action)
			}
			calls := host.GetCalloutAttributesFromContext(id)
			if len(calls) != 1 {
				t.Fatalf("%d callouts from the stream, want 1", len(calls))
			}
			c := calls[0]
			if p, _ := header(c.Headers, ":path"); c.Upstream != "svc" || p != "/check" || string(c.Body) != "check" {
				t.Errorf("callout %+v", c)
			}
			host.CallOnHttpCallResponse(c.CalloutID, tc.respHeaders, nil, []byte(tc.body))
			if got := host.GetCurrentHttpStreamAction(id); got != tc.wantAction {
				t.Errorf("stream action after response %v, want %v", got, tc.wantAction)
			}
			r := host.GetSentLocalResponse(id)
			switch {
			case tc.wantReply == 0 && r != nil:
				t.Errorf("unexpected local response %+v", r)
			case tc.wantReply != 0 && (r == nil || r.StatusCode != tc.wantReply):
				t.Errorf("local response %+v, want status %d", r, tc.wantReply)
			}
			if tc.wantReply == 0 && !hasLog(host.GetInfoLogs(), "stream callout response status=200 body=ok") {
				t.Errorf("stream handler did not see the answer: %q", host.GetInfoLogs())
			}
			noErrors(t, host)
		})
	}
	t.Run("root callout answer goes to the root", func(t *testing.T) {
		host := start(t, proxytest.NewEmulatorOption())
		host.Tick()
		calls := host.GetCalloutAttributesFromContext(proxytest.PluginContextID)
		if len(calls) != 1 || calls[0].Upstream != "root-cluster" {
			t.Fatalf("root callouts %+v, want one to root-cluster", calls)
		}
		host.CallOnHttpCallResponse(calls[0].CalloutID, [][2]string{{":status", "200"}}, nil, []byte("pong"))
		want := "root callout response token=" + strconv.Itoa(int(calls[0].CalloutID)) + " headers=1 body=pong"
		if !hasLog(host.GetInfoLogs(), want) {
			t.Errorf("want log %q in %q", want, host.GetInfoLogs())
		}
		noErrors(t, host)
	})
	t.Run("property read by path", func(t *testing.T) {
		host := start(t, proxytest.NewEmulatorOption().WithProperty([]string{"node", "id"}, []byte("gw-1")))
		id, _ := request(host, "property")
		if v, _ := header(host.GetCurrentRequestHeaders(id), "x-node-id"); v != "gw-1" {
			t.Errorf("x-node-id = %q, want gw-1", v)
		}
		noErrors(t, host)
	})
	t.Run("metrics", func(t *testing.T) {
		host := start(t, proxytest.NewEmulatorOption())
		request(host, "plain")
		request(host, "metric")
		if v, err := host.GetCounterMetric("probe.requests"); err != nil || v != 2 {
			t.Errorf("probe.requests = %d, %v; want 2", v, err)
		}
		if !hasLog(host.GetInfoLogs(), "probe: requests=2") {
			t.Errorf("GetMetric result not logged: %q", host.GetInfoLogs())
		}
		noErrors(t, host)
	})
	t.Run("shared data CAS and not-found", func(t *testing.T) {
		host := start(t, proxytest.NewEmulatorOption())
		request(host, "shared")
		if !hasLog(host.GetInfoLogs(), "probe: shared value=v1 stale_cas_mismatch=true") {
			t.Errorf("shared data round trip: %q", host.GetInfoLogs())
		}
		noErrors(t, host)
	})
}

// TestStreamsForgottenAtDone runs the floor module under internal/wazerohost, which ends every
// stream as Envoy does (proxy_on_done, then proxy_on_delete when exported): the binding
// must forget each stream in proxy_on_done, since it does not export proxy_on_delete, or
// every request would leave an entry in its stream table.
func TestStreamsForgottenAtDone(t *testing.T) {
	h, err := wasmhost.New(wasmhost.Config{
		Wasm:     wasmtest.BuildWasm(t, "./filter/bench/floor"),
		Workers:  1,
		Upstream: wasmhost.StaticUpstream(200, nil, []byte("ok")),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	const requests = 1000
	for i := range requests {
		req := &wasmhost.Request{Method: "GET", Path: "/search", Authority: "api",
			Header: []wasmhost.Pair{{"x-api-key", "k" + strconv.Itoa(i)}}}
		if _, err := h.Exchange(0, req, &wasmhost.Response{Status: 200}); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	var tickErr error
	rootID := h.RootContextID(0)
	h.CallOnVM(0, func(ctx context.Context, mod api.Module) {
		_, tickErr = mod.ExportedFunction("proxy_on_tick").Call(ctx, uint64(rootID))
	})
	if tickErr != nil {
		t.Fatalf("proxy_on_tick: %v", tickErr)
	}
	m := h.Metrics()
	streams, ok := m["floor.streams"]
	if !ok {
		t.Fatalf("no floor.streams gauge after a tick: %v", m)
	}
	if streams != 0 {
		t.Errorf("binding tracks %d streams after %d finished requests, want 0", streams, requests)
	}
	if pinned := m["floor.pinned_buffers"]; pinned != 0 {
		t.Errorf("%d buffers still pinned, want 0", pinned)
	}
	if calls := h.HostCalls(); calls["proxy_on_delete"] != 0 {
		t.Errorf("host called proxy_on_delete %d times on a module that does not export it", calls["proxy_on_delete"])
	}
}

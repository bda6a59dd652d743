package perf

import (
	"os"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/wasmtest"
	"github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// benchModules are the three modules of the decision-cost comparison and their plugin
// configurations.
var benchModules = []struct {
	name, pkg string
	config    []byte
}{
	{"empty", EmptyPkg, nil},
	{"floor", FloorPkg, nil},
	{"filter", FilterPkg, LocalConfig("token_bucket", 1_000_000)},
}

// BenchmarkDecision is the decision cost under go test: one request through
// proxy_on_request_headers and proxy_on_response_headers, context create and delete
// included, in wazero's compiler via the host's direct Exchange path.
//
// TOLLGATE_DECISION_WASM names a module file to run as the filter instead of the one
// built from ./filter. With a module that keeps its functions' names and wazero's perf
// map, perf names every guest frame (from the repository's root):
//
//	go run ./filter/wasmbuild/cmd/tollgate-wasm -names -o /tmp/named.wasm ./filter
//	go test -tags perfmap -c -o /tmp/perf.test ./bench/perf
//	TOLLGATE_DECISION_WASM=/tmp/named.wasm perf record -g -- /tmp/perf.test \
//		-test.run '^$' -test.bench 'Decision$/filter' -test.benchtime 20s
//	perf report --no-children --sort symbol
func BenchmarkDecision(b *testing.B) {
	for _, m := range benchModules {
		b.Run(m.name, func(b *testing.B) {
			var wasm []byte
			if path := os.Getenv("TOLLGATE_DECISION_WASM"); path != "" && m.pkg == FilterPkg {
				var err error
				if wasm, err = os.ReadFile(path); err != nil {
					b.Fatal(err)
				}
			} else {
				wasm = wasmtest.BuildWasm(b, m.pkg)
			}
			h, err := wazerohost.New(wazerohost.Config{Wasm: wasm, PluginConfig: m.config, Workers: 1, LogLevel: wazerohost.LogWarn})
			if err != nil {
				b.Fatal(err)
			}
			defer h.Close()
			req := BenchRequest("k-bench")
			for i := 0; i < 1000; i++ {
				if _, err := h.Exchange(0, req, UpstreamOK); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				resp, err := h.Exchange(0, req, UpstreamOK)
				if err != nil || resp.Status != 200 {
					b.Fatalf("status %v, err %v", resp, err)
				}
			}
		})
	}
}

// TestFloorHostCalls pins what the decision-cost comparison rests on: the floor module
// makes exactly the host calls of one single-rule decision, and the host counts them
// (Config.CountHostCalls) per request, with two host→guest allocations (the header map
// and the shared-data value).
func TestFloorHostCalls(t *testing.T) {
	wasm := wasmtest.BuildWasm(t, FloorPkg)
	h, err := wazerohost.New(wazerohost.Config{Wasm: wasm, Workers: 1, CountHostCalls: true, LogLevel: wazerohost.LogWarn})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	req := BenchRequest("k-test")
	if _, err := h.Exchange(0, req, UpstreamOK); err != nil { // creates the bucket
		t.Fatal(err)
	}
	const n = 100
	before := h.HostCalls()
	for i := 0; i < n; i++ {
		resp, err := h.Exchange(0, req, UpstreamOK)
		if err != nil || resp.Status != 200 {
			t.Fatalf("exchange: %v, %+v", err, resp)
		}
	}
	after := h.HostCalls()
	want := map[string]int64{
		"proxy_get_header_map_pairs": 1,
		"proxy_get_shared_data":      1,
		"proxy_set_shared_data":      1,
		"proxy_add_header_map_value": 4,
		"proxy_on_memory_allocate":   2,
	}
	for name, per := range want {
		if got := after[name] - before[name]; got != per*n {
			t.Errorf("%s: %d calls in %d requests, want %d", name, got, n, per*n)
		}
	}
	for name, v := range after {
		if _, ok := want[name]; !ok && v != before[name] {
			t.Errorf("unexpected host call %s: %d", name, v-before[name])
		}
	}
}

func TestPercentile(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	sorted := []time.Duration{ms(1), ms(2), ms(3), ms(4), ms(5), ms(6), ms(7), ms(8), ms(9), ms(10)}
	cases := []struct {
		name string
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{"empty", nil, 99, 0},
		{"min", sorted, 0, ms(1)},
		{"median", sorted, 50, ms(5)},
		{"p99", sorted, 99, ms(9)},
		{"max", sorted, 100, ms(10)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Percentile(c.in, c.p); got != c.want {
				t.Fatalf("Percentile(%v, %v) = %v, want %v", c.in, c.p, got, c.want)
			}
		})
	}
}

package main

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tetratelabs/wazero/api"

	wasmhost "github.com/tollgate-rl/tollgate/e2e/host"
	"github.com/tollgate-rl/tollgate/filter/wasmtest"
)

func TestExpLeak(t *testing.T) {
	h, err := wasmhost.New(wasmhost.Config{Wasm: wasmtest.FilterWasm(t), Workers: 2,
		PluginConfig: []byte(`{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"api","limit":50,"window":"1h"}]}`),
		Upstream:     wasmhost.StaticUpstream(200, nil, nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	mem := func(w int) (n uint32) {
		h.CallOnVM(w, func(ctx context.Context, mod api.Module) { n = mod.Memory().Size() })
		return
	}
	start := time.Now()
	const total = 1000000
	for phase := 0; phase < 10; phase++ {
		var wg sync.WaitGroup
		for w := 0; w < 2; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := &wasmhost.Request{Method: "GET", Path: "/x", Authority: "api", Header: []wasmhost.Pair{{"x-api-key", ""}}}
				up := &wasmhost.Response{Status: 200}
				for i := w; i < total/10; i += 2 {
					req.Header[0][1] = "k" + strconv.Itoa((phase*total/10+i)%200000)
					if _, err := h.Exchange(w, req, up); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		t.Logf("phase %d %v mem %d %d keys %d bytes %d metrics %v", phase, time.Since(start), mem(0), mem(1), h.SharedDataKeys(), h.SharedDataBytes(), h.Metrics())
	}
}

package main

import (
	"sync"
	"sync/atomic"
	"testing"

	wasmhost "github.com/tollgate-rl/tollgate/e2e/host"
	"github.com/tollgate-rl/tollgate/filter/wasmtest"
)

func TestExpWorkers(t *testing.T) {
	h, err := wasmhost.New(wasmhost.Config{Wasm: wasmtest.FilterWasm(t), Workers: 4,
		PluginConfig: []byte(`{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"api","limit":50,"window":"1h"}]}`),
		Upstream:     wasmhost.StaticUpstream(200, nil, nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for round := 0; round < 100; round++ {
		var ok, rej atomic.Int64
		var wg sync.WaitGroup
		for i := 0; i < 400; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := h.HandleOn(i%4, &wasmhost.Request{Method: "GET", Path: "/x", Authority: "api", Header: []wasmhost.Pair{{"x-api-key", "k" + itoa(round)}}})
				switch r.Status {
				case 200:
					ok.Add(1)
				case 429:
					rej.Add(1)
				default:
					t.Errorf("status %d", r.Status)
				}
			}()
		}
		wg.Wait()
		t.Logf("round %d ok %d rej %d metrics %v", round, ok.Load(), rej.Load(), h.Metrics()["tollgate.cas_retry_exhausted"])
	}
}

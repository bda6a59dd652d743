package wasmtest

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// StartTimes compiles each module once (wazero's compiler), then n times per module
// instantiates it and runs _initialize, the modules taking turns so that load from
// elsewhere on the machine falls on all of them alike, and returns each module's times,
// sorted. Proxy-wasm imports answer zeros and WASI is wazero's own, so what it times is
// the module's own start: the Go runtime's initialisation and, for a packed module
// (wasmbuild.Pack), the decoding of its data.
func StartTimes(n int, mods ...[]byte) ([][]time.Duration, error) {
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
		return nil, fmt.Errorf("instantiating WASI: %w", err)
	}
	compiled := make([]wazero.CompiledModule, len(mods))
	for i, wasm := range mods {
		cm, err := rt.CompileModule(ctx, wasm)
		if err != nil {
			return nil, fmt.Errorf("module %d: %w", i, err)
		}
		compiled[i] = cm
	}
	// Every module imports the same proxy-wasm functions: one set of stubs serves all.
	if err := stubEnv(ctx, rt, compiled[0]); err != nil {
		return nil, err
	}
	times := make([][]time.Duration, len(mods))
	cfg := wazero.NewModuleConfig().WithStartFunctions().WithName("")
	for range n {
		for i, cm := range compiled {
			t0 := time.Now()
			mod, err := rt.InstantiateModule(ctx, cm, cfg)
			if err != nil {
				return nil, fmt.Errorf("module %d: %w", i, err)
			}
			if _, err := mod.ExportedFunction("_initialize").Call(ctx); err != nil {
				return nil, fmt.Errorf("module %d: _initialize: %w", i, err)
			}
			times[i] = append(times[i], time.Since(t0))
			mod.Close(ctx)
		}
	}
	for _, t := range times {
		slices.Sort(t)
	}
	return times, nil
}

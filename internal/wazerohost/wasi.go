package wazerohost

import (
	"context"
	"fmt"
	"slices"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// WASIMode picks which Envoy's WASI surface the host offers a module. Envoy's Wasm
// host (proxy-wasm-cpp-host) grew its WASI support release by release, and a Go module
// that runs on one release can fail to link, fail to start or abort under load on an
// older one; these modes reproduce those releases so the filter can be run under them.
type WASIMode int

const (
	// WASIFull offers all of WASI preview 1 as wazero implements it (poll_oneoff
	// sleeps): what an Envoy carrying proxy-wasm-cpp-host PR 533 comes closest to.
	WASIFull WASIMode = iota
	// WASIEnvoy133 is Envoy 1.33 to 1.38: the long-standing functions plus the ones
	// Go's runtime imports (sched_yield, poll_oneoff, fd_fdstat_set_flags), and
	// fd_fdstat_get / fd_fdstat_set_flags allowed during _initialize (PR 427), but
	// poll_oneoff answered with ENOSYS, which aborts Go's runtime (golang/go#78513).
	WASIEnvoy133
	// WASILegacy is Envoy before 1.33: only the long-standing WASI functions (a module
	// importing any other fails to load) and only Envoy's start-up allow-list while
	// _initialize runs (any other WASI call there traps the VM).
	WASILegacy
)

func (m WASIMode) String() string {
	switch m {
	case WASIFull:
		return "full WASI"
	case WASIEnvoy133:
		return "Envoy 1.33-1.38"
	case WASILegacy:
		return "Envoy before 1.33"
	}
	return fmt.Sprintf("WASIMode(%d)", int(m))
}

// LegacyWASI are the WASI functions Envoy has offered for years (FOR_ALL_WASI_FUNCTIONS
// in proxy-wasm-cpp-host, under both wasi_unstable and wasi_snapshot_preview1).
var LegacyWASI = []string{
	"fd_write", "fd_read", "fd_seek", "fd_close", "fd_fdstat_get", "environ_get",
	"environ_sizes_get", "args_get", "args_sizes_get", "clock_time_get", "random_get",
	"proc_exit", "path_open", "fd_prestat_get", "fd_prestat_dir_name",
}

// goWASI are the functions PR 427 added for Go modules (Envoy 1.33).
var goWASI = []string{"sched_yield", "poll_oneoff", "fd_fdstat_set_flags"}

// StartupWASI are the WASI functions Envoy allows while _initialize runs
// (WasmBase::startVm's restricted callback list, besides proxy_log).
var StartupWASI = []string{
	"fd_write", "args_sizes_get", "args_get", "environ_sizes_get", "environ_get",
	"fd_prestat_get", "fd_prestat_dir_name", "clock_time_get", "random_get",
}

// errnoNOSYS is WASI's "function not supported".
const errnoNOSYS = 52

// offered returns the WASI functions the mode offers, or nil for all of them.
func (m WASIMode) offered() []string {
	switch m {
	case WASIEnvoy133:
		return slices.Concat(LegacyWASI, goWASI)
	case WASILegacy:
		return LegacyWASI
	}
	return nil
}

// startup returns the WASI functions allowed during _initialize, or nil for all.
func (m WASIMode) startup() []string {
	switch m {
	case WASIEnvoy133:
		return slices.Concat(StartupWASI, []string{"fd_fdstat_get", "fd_fdstat_set_flags"})
	case WASILegacy:
		return StartupWASI
	}
	return nil
}

// instantiateWASI defines the WASI host module for the mode.
func (h *Host) instantiateWASI(ctx context.Context) error {
	mode := h.cfg.WASI
	if mode == WASIFull {
		_, err := wasi_snapshot_preview1.Instantiate(ctx, h.rt)
		return err
	}
	b := h.rt.NewHostModuleBuilder(wasi_snapshot_preview1.ModuleName)
	wasi_snapshot_preview1.NewFunctionExporter().ExportFunctions(b)
	if mode == WASIEnvoy133 {
		b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(_ context.Context, _ api.Module, stack []uint64) {
			h.stats.pollOneoff.Add(1)
			stack[0] = errnoNOSYS
		}), []api.ValueType{api.ValueTypeI32, api.ValueTypeI32, api.ValueTypeI32, api.ValueTypeI32},
			[]api.ValueType{api.ValueTypeI32}).Export("poll_oneoff")
	}
	// The start-up allow-list: a listener on every WASI function traps a call made
	// while a VM runs _initialize, as Envoy's restricted callback does.
	allowed := mode.startup()
	ctx = experimental.WithFunctionListenerFactory(ctx, experimental.FunctionListenerFactoryFunc(
		func(d api.FunctionDefinition) experimental.FunctionListener {
			name := d.Name()
			if slices.Contains(allowed, name) {
				return nil
			}
			return experimental.FunctionListenerFunc(func(ctx context.Context, _ api.Module, _ api.FunctionDefinition, _ []uint64, _ experimental.StackIterator) {
				if v, ok := ctx.Value(vmKey{}).(*vm); ok && v.starting {
					h.stats.startupRefused.Add(1)
					panic(fmt.Errorf("wasi %s called during _initialize, outside the start-up allow-list of %s", name, mode))
				}
			})
		}))
	_, err := b.Instantiate(ctx)
	return err
}

// checkWASIImports refuses a module importing WASI functions the mode does not offer,
// as Envoy refuses to load it ("missing import").
func checkWASIImports(mode WASIMode, cm wazero.CompiledModule) error {
	offered := mode.offered()
	if offered == nil {
		return nil
	}
	for _, d := range cm.ImportedFunctions() {
		mod, name, _ := d.Import()
		if mod == wasi_snapshot_preview1.ModuleName && !slices.Contains(offered, name) {
			return fmt.Errorf("module imports %s.%s, which %s does not offer", mod, name, mode)
		}
	}
	return nil
}

package wasmtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// FuncSig is one imported or exported function of a module.
type FuncSig struct {
	Module  string // import module ("env", "wasi_snapshot_preview1"); empty for exports
	Name    string
	Params  []api.ValueType
	Results []api.ValueType
}

// String renders the signature as "module.name(i32,i64)->i32".
func (f FuncSig) String() string {
	var b strings.Builder
	if f.Module != "" {
		b.WriteString(f.Module)
		b.WriteByte('.')
	}
	b.WriteString(f.Name)
	b.WriteByte('(')
	for i, p := range f.Params {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(api.ValueTypeName(p))
	}
	b.WriteString(")->")
	switch len(f.Results) {
	case 0:
		b.WriteString("()")
	case 1:
		b.WriteString(api.ValueTypeName(f.Results[0]))
	default:
		b.WriteByte('(')
		for i, r := range f.Results {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(api.ValueTypeName(r))
		}
		b.WriteByte(')')
	}
	return b.String()
}

// ListABI returns the module's imported and exported functions, as the runtime sees
// them after compiling it.
func ListABI(wasm []byte) (imports, exports []FuncSig, err error) {
	ctx := context.Background()
	r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer r.Close(ctx)
	cm, err := r.CompileModule(ctx, wasm)
	if err != nil {
		return nil, nil, fmt.Errorf("compiling module: %w", err)
	}
	for _, d := range cm.ImportedFunctions() {
		mod, name, _ := d.Import()
		imports = append(imports, FuncSig{Module: mod, Name: name, Params: d.ParamTypes(), Results: d.ResultTypes()})
	}
	for name, d := range cm.ExportedFunctions() {
		exports = append(exports, FuncSig{Name: name, Params: d.ParamTypes(), Results: d.ResultTypes()})
	}
	sortSigs(imports)
	sortSigs(exports)
	return imports, exports, nil
}

func sortSigs(s []FuncSig) {
	slices.SortFunc(s, func(a, b FuncSig) int { return strings.Compare(a.String(), b.String()) })
}

// StartupWASICalls instantiates the module in wazero with WASI and stub "env" proxy
// functions, runs _initialize, and returns every host function called during it, in
// call order (with repeats). WASI functions appear by their bare name
// ("clock_time_get"); anything else as "module.name", so a proxy call during
// start-up shows up too.
func StartupWASICalls(wasm []byte) ([]string, error) {
	rec := &recorder{}
	ctx := experimental.WithFunctionListenerFactory(context.Background(), rec)
	r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer r.Close(ctx)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, r); err != nil {
		return nil, fmt.Errorf("instantiating WASI: %w", err)
	}
	cm, err := r.CompileModule(ctx, wasm)
	if err != nil {
		return nil, fmt.Errorf("compiling module: %w", err)
	}
	if err := stubEnv(ctx, r, cm); err != nil {
		return nil, err
	}
	cfg := wazero.NewModuleConfig().WithStartFunctions().WithStdout(&bytes.Buffer{}).WithStderr(&bytes.Buffer{})
	mod, err := r.InstantiateModule(ctx, cm, cfg)
	if err != nil {
		return nil, fmt.Errorf("instantiating module: %w", err)
	}
	init := mod.ExportedFunction("_initialize")
	if init == nil {
		return nil, errors.New("module does not export _initialize (not a reactor?)")
	}
	rec.on = true
	_, err = init.Call(ctx)
	rec.on = false
	if err != nil {
		return rec.calls, fmt.Errorf("_initialize: %w", err)
	}
	return rec.calls, nil
}

// stubEnv defines every function the module imports from "env" as a host function that
// returns zeros (proxy status OK).
func stubEnv(ctx context.Context, r wazero.Runtime, cm wazero.CompiledModule) error {
	b := r.NewHostModuleBuilder("env")
	n := 0
	for _, d := range cm.ImportedFunctions() {
		mod, name, _ := d.Import()
		if mod != "env" {
			continue
		}
		results := len(d.ResultTypes())
		b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(_ context.Context, _ api.Module, stack []uint64) {
			for i := 0; i < results; i++ {
				stack[i] = 0
			}
		}), d.ParamTypes(), d.ResultTypes()).Export(name)
		n++
	}
	if n == 0 {
		return nil
	}
	if _, err := b.Instantiate(ctx); err != nil {
		return fmt.Errorf("instantiating env stubs: %w", err)
	}
	return nil
}

// recorder is a function listener that notes host functions called while on.
type recorder struct {
	on    bool
	calls []string
}

func (r *recorder) NewFunctionListener(d api.FunctionDefinition) experimental.FunctionListener {
	if d.GoFunction() == nil {
		return nil // guest functions: only host calls matter
	}
	name := d.Name()
	if mod := d.ModuleName(); mod != wasi_snapshot_preview1.ModuleName {
		name = mod + "." + name
	}
	return experimental.FunctionListenerFunc(func(context.Context, api.Module, api.FunctionDefinition, []uint64, experimental.StackIterator) {
		if r.on {
			r.calls = append(r.calls, name)
		}
	})
}

func i32s(n int) []api.ValueType { return slices.Repeat([]api.ValueType{api.ValueTypeI32}, n) }

func spec(params []api.ValueType, results ...api.ValueType) FuncSig {
	return FuncSig{Params: params, Results: results}
}

var i32, i64 = api.ValueTypeI32, api.ValueTypeI64

// SpecExports are the callbacks of proxy-wasm ABI v0.2.1 that filter/abi exports, with
// the spec's signatures, plus the WASI reactor entry point. A module built on
// filter/abi exports exactly these functions. Callbacks the binding has no work for
// (request body and trailers, response trailers, queues, proxy_on_log) are not among
// them, nor is proxy_on_delete (the binding forgets a context in proxy_on_done, which the
// host calls right before): a host skips a callback the module does not export.
var SpecExports = map[string]FuncSig{
	"_initialize":                 spec(nil),
	"proxy_abi_version_0_2_1":     spec(nil),
	"proxy_on_memory_allocate":    spec(i32s(1), i32),
	"proxy_on_context_create":     spec(i32s(2)),
	"proxy_on_vm_start":           spec(i32s(2), i32),
	"proxy_on_configure":          spec(i32s(2), i32),
	"proxy_on_tick":               spec(i32s(1)),
	"proxy_on_http_call_response": spec(i32s(5)),
	"proxy_on_request_headers":    spec(i32s(3), i32),
	"proxy_on_response_headers":   spec(i32s(3), i32),
	"proxy_on_response_body":      spec(i32s(3), i32),
	"proxy_on_done":               spec(i32s(1), i32),
}

// SpecEnvImports are the host functions filter/abi may import, with the spec's
// signatures. The linker drops imports a module never calls, so a module's "env"
// imports are a subset.
var SpecEnvImports = map[string]FuncSig{
	"proxy_log":                          spec(i32s(3), i32),
	"proxy_get_buffer_bytes":             spec(i32s(5), i32),
	"proxy_get_header_map_pairs":         spec(i32s(3), i32),
	"proxy_get_header_map_value":         spec(i32s(5), i32),
	"proxy_add_header_map_value":         spec(i32s(5), i32),
	"proxy_replace_header_map_value":     spec(i32s(5), i32),
	"proxy_send_local_response":          spec(i32s(8), i32),
	"proxy_get_shared_data":              spec(i32s(5), i32),
	"proxy_set_shared_data":              spec(i32s(5), i32),
	"proxy_get_property":                 spec(i32s(4), i32),
	"proxy_set_property":                 spec(i32s(4), i32),
	"proxy_set_tick_period_milliseconds": spec(i32s(1), i32),
	"proxy_http_call":                    spec(i32s(10), i32),
	"proxy_continue_stream":              spec(i32s(1), i32),
	"proxy_set_effective_context":        spec(i32s(1), i32),
	"proxy_define_metric":                spec(i32s(4), i32),
	"proxy_increment_metric":             spec([]api.ValueType{i32, i64}, i32),
	"proxy_record_metric":                spec([]api.ValueType{i32, i64}, i32),
	"proxy_get_metric":                   spec(i32s(2), i32),
}

// I64Allowed lists the only i64 values allowed anywhere in a module's ABI, by
// "module.name" and parameter index: the value of proxy_record_metric and the delta of
// proxy_increment_metric (i64 in the spec) and the precision argument of WASI
// clock_time_get. Everything else must be i32; a Go int slipping into a signature
// shows up as an i64 and Envoy refuses the module.
var I64Allowed = map[string][]int{
	"env.proxy_increment_metric":            {1},
	"env.proxy_record_metric":               {1},
	"wasi_snapshot_preview1.clock_time_get": {1},
}

// OwnExports are the functions outside proxy-wasm a module may export besides
// SpecExports, with their signatures: the filter's tollgate_flush_metrics, which the
// project's wazero host calls before it reads the metrics (proxies never call it).
var OwnExports = map[string]FuncSig{
	"tollgate_flush_metrics": spec(nil),
}

// CheckABI reports through t every function of wasm whose signature breaks the ABI:
// an i64 outside I64Allowed, an "env" import not in SpecEnvImports or with another
// signature, an export missing from or different from SpecExports, or extra to it and
// not one of OwnExports (with OwnExports' signature).
func CheckABI(t testing.TB, wasm []byte) {
	t.Helper()
	imports, exports, err := ListABI(wasm)
	if err != nil {
		t.Fatalf("reading the module's ABI: %v", err)
		return
	}
	for _, f := range append(slices.Clone(imports), exports...) {
		key := f.Module + "." + f.Name
		for i, p := range f.Params {
			if p != i32 && !(p == i64 && slices.Contains(I64Allowed[key], i)) {
				t.Errorf("%s: parameter %d is %s, want i32", f, i, api.ValueTypeName(p))
			}
		}
		for _, r := range f.Results {
			if r != i32 {
				t.Errorf("%s: result is %s, want i32", f, api.ValueTypeName(r))
			}
		}
	}
	for _, f := range imports {
		if f.Module != "env" {
			continue
		}
		want, ok := SpecEnvImports[f.Name]
		if !ok {
			t.Errorf("unexpected host import %s", f)
			continue
		}
		want.Module, want.Name = f.Module, f.Name
		if f.String() != want.String() {
			t.Errorf("import %s, want %s", f, want)
		}
	}
	got := map[string]FuncSig{}
	for _, f := range exports {
		got[f.Name] = f
		if _, ok := SpecExports[f.Name]; ok {
			continue
		}
		if want, ok := OwnExports[f.Name]; !ok {
			t.Errorf("unexpected export %s", f)
		} else if want.Name = f.Name; f.String() != want.String() {
			t.Errorf("export %s, want %s", f, want)
		}
	}
	for name, want := range SpecExports {
		want.Name = name
		f, ok := got[name]
		if !ok {
			t.Errorf("missing export %s", want)
			continue
		}
		if f.String() != want.String() {
			t.Errorf("export %s, want %s", f, want)
		}
	}
}

// StartupAllowed are the WASI calls Envoy's proxy-wasm host allows while _initialize
// runs (the restricted start-up list of WasmBase::startVm, besides proxy_log) in every
// release with a Wasm runtime. Go's syscall and os packages also call fd_fdstat_get and
// fd_fdstat_set_flags there, which Envoys before 1.33 refuse; wasmbuild's shim answers
// those inside the module.
var StartupAllowed = []string{
	"fd_write", "args_sizes_get", "args_get", "environ_sizes_get", "environ_get",
	"fd_prestat_get", "fd_prestat_dir_name", "clock_time_get", "random_get",
}

// LegacyWASI are the WASI functions Envoy's proxy-wasm host has offered for years
// (FOR_ALL_WASI_FUNCTIONS, before Go-specific additions): a module importing any other
// WASI function fails to link on those releases.
var LegacyWASI = []string{
	"fd_write", "fd_read", "fd_seek", "fd_close", "fd_fdstat_get", "environ_get",
	"environ_sizes_get", "args_get", "args_sizes_get", "clock_time_get", "random_get",
	"proc_exit", "path_open", "fd_prestat_get", "fd_prestat_dir_name",
}

// CheckWASIImports reports through t every WASI function wasm imports outside
// LegacyWASI, and any import from a module other than WASI and "env".
func CheckWASIImports(t testing.TB, wasm []byte) {
	t.Helper()
	imports, _, err := ListABI(wasm)
	if err != nil {
		t.Fatalf("reading the module's imports: %v", err)
		return
	}
	n := 0
	for _, f := range imports {
		switch f.Module {
		case wasi_snapshot_preview1.ModuleName:
			n++
			if !slices.Contains(LegacyWASI, f.Name) {
				t.Errorf("imports %s, outside the WASI functions every Envoy offers %v", f, LegacyWASI)
			}
		case "env":
		default:
			t.Errorf("imports %s from an unknown module", f)
		}
	}
	if n == 0 {
		t.Errorf("no WASI import found; Go's runtime always imports some, so the reader is broken")
	}
}

// CheckStartup reports through t every distinct host call wasm makes during
// _initialize that is not in StartupAllowed.
func CheckStartup(t testing.TB, wasm []byte) {
	t.Helper()
	calls, err := StartupWASICalls(wasm)
	if err != nil {
		t.Fatalf("recording start-up calls: %v", err)
		return
	}
	if len(calls) == 0 {
		t.Errorf("no host call recorded during _initialize; the Go runtime always makes some, so the recorder is broken")
		return
	}
	var bad []string
	for _, c := range calls {
		if !slices.Contains(StartupAllowed, c) && !slices.Contains(bad, c) {
			bad = append(bad, c)
		}
	}
	if len(bad) > 0 {
		t.Errorf("_initialize calls %v outside the allowed set %v (all calls in order: %v)", bad, StartupAllowed, calls)
	}
}

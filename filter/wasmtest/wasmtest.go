// Package wasmtest holds the test tooling for Tollgate's proxy-wasm modules: building
// a package to a wasip1 reactor once per test binary, adding a test-only _start export
// so the SDK's emulator can load a Go reactor, and reading back a module's ABI and the
// WASI calls it makes at start-up. Filter tests run against the compiled module, not
// only against native Go, because the ABI (i32 signatures, memory handed to the host,
// start-up calls) only exists there.
//
// It is imported by _test.go files only and never built into the module itself.
package wasmtest

import (
	"strings"
	"sync"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
)

type build struct {
	once sync.Once
	wasm []byte
	err  error
}

var (
	buildsMu sync.Mutex
	builds   = map[string]*build{}
)

// BuildWasm builds pkg (an import path, or a path relative to the repository root such
// as "./filter/bench/floor") with the shipping recipe (wasmbuild.Build: the Go
// toolchain's wasip1 reactor with the WASI shim linked in and wasm-opt run over it, as
// `make wasm` builds it)
// and returns the module. Each package is built once per test binary. A failed build
// fails the test: tests against the compiled module never skip.
func BuildWasm(t testing.TB, pkg string) []byte {
	t.Helper()
	return BuildWasmTags(t, pkg)
}

// BuildWasmTags is BuildWasm with build tags (test-only exports such as the filter's
// tollgate_gcprobe).
func BuildWasmTags(t testing.TB, pkg string, tags ...string) []byte {
	t.Helper()
	key := pkg + " " + strings.Join(tags, ",")
	buildsMu.Lock()
	b, ok := builds[key]
	if !ok {
		b = &build{}
		builds[key] = b
	}
	buildsMu.Unlock()
	b.once.Do(func() { b.wasm, b.err = wasmbuild.Build(pkg, tags...) })
	if b.err != nil {
		t.Fatalf("building %q (tags %v) for wasip1: %v", pkg, tags, b.err)
	}
	return b.wasm
}

// FilterWasm returns the Tollgate filter module built from ./filter. It fails the test
// when the build fails, under CI (CI=true) and everywhere else alike.
func FilterWasm(t testing.TB) []byte {
	t.Helper()
	return BuildWasm(t, "./filter")
}

// EmulatorWasm builds pkg for the SDK's emulator (proxytest): the shipping recipe with
// tag tollgate_proxytest, which adds the no-op proxy_on_log export the emulator calls
// unconditionally (filter/abi/onlog_proxytest.go). Pass the result to WithStartAlias.
func EmulatorWasm(t testing.TB, pkg string) []byte {
	t.Helper()
	return BuildWasmTags(t, pkg, "tollgate_proxytest")
}

// Package abi is Tollgate's binding to the proxy-wasm ABI v0.2.1
// (https://github.com/proxy-wasm/spec/tree/main/abi-versions/v0.2.1) for modules built
// with standard Go: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared.
//
// It exists so that the few dozen host calls Tollgate makes are under our control: how
// memory crosses the boundary (one host call and one allocation per header map),
// which WASI calls run at start-up, and that nothing panics across an export. The
// tetratelabs SDK needs TinyGo; this binding needs only the standard toolchain. It is
// the only package in the repository with //go:wasmimport and //go:wasmexport, so the
// rest of the filter is plain Go that is tested natively.
//
// # Shape
//
// The module is a WASI reactor: the host runs _initialize (package init), never main.
// The plugin registers its Root with SetRoot from an init function. The binding keeps
// the plugin's root contexts and one Stream per HTTP request, and turns the host's
// callbacks (proxy_on_*) into calls on them. Calls into the host are methods on the
// zero-size Host type, so the plugin can own small interfaces that Host satisfies.
//
// # Rules the binding keeps
//
//   - Every import and export uses only i32 values, except the two the spec declares as
//     i64 (the value of proxy_record_metric and the delta of proxy_increment_metric).
//     Go's int is 64-bit on wasm, so signatures use uint32/int32/pointers only; a test
//     reads the compiled module's signatures back.
//   - Memory handed to the host from proxy_on_memory_allocate is referenced by the host
//     only as an i32 offset the Go GC cannot see, so the binding pins it (PinnedBuffers)
//     until the host call that returns it has finished and the binding adopts it.
//   - Nothing here imports os, fmt, log or encoding/json: os (which the others pull in)
//     calls fd_fdstat_get and fd_fdstat_set_flags during _initialize, and Envoys older
//     than proxy-wasm-cpp-host PR 427 refuse WASI calls outside a short start-up list.
//   - A Go panic would trap the VM and fail every request of that worker, so each export
//     recovers as a last line of defence, logs through proxy_log and answers Continue.
//   - Only callbacks with work to do are exported: the host skips the others as if they
//     had answered Continue. A stream is forgotten in proxy_on_done, which Envoy calls
//     right before proxy_on_delete, so proxy_on_delete is not exported either.
//
// Outside wasip1 the host calls are stubs that return ErrUnimplemented, so packages that
// use the types (Action, Root, Stream, Host) still build and test natively.
package abi

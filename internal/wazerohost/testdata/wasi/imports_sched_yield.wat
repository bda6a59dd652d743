;; A minimal proxy-wasm module importing sched_yield, which Envoy offers only since 1.33
;; (proxy-wasm-cpp-host PR 427). Compiled with: wat2wasm imports_sched_yield.wat
(module
  (import "wasi_snapshot_preview1" "sched_yield" (func $sched_yield (result i32)))
  (memory (export "memory") 1)
  (func (export "_initialize"))
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param i32) (result i32) (drop (call $sched_yield)) (i32.const 1024))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1)))

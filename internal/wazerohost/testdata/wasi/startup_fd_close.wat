;; A minimal proxy-wasm module that imports only a long-standing WASI function
;; (fd_close) but calls it during _initialize, where Envoy's start-up allow-list
;; refuses it. Compiled with: wat2wasm startup_fd_close.wat
(module
  (import "wasi_snapshot_preview1" "fd_close" (func $fd_close (param i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_initialize") (drop (call $fd_close (i32.const 99))))
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param i32) (result i32) (i32.const 1024))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1)))

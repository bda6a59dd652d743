//go:build wasip1 && tollgate_proxytest

package abi

// Test builds for the SDK's emulator only (-tags tollgate_proxytest, see
// wasmtest.EmulatorWasm): proxytest calls proxy_on_log on every stream and crashes on a
// module that does not export it. Envoy and the project's wazero host call it only when
// it is exported, and no handler here needs the access-log phase, so the shipping
// module leaves it out.
//
//go:wasmexport proxy_on_log
func proxyOnLog(contextID uint32) {}

// Package e2e is Tollgate's end-to-end suite: the compiled filter on wazero gateways
// (internal/wazerohost), two tollgate-ratelimit processes and a six-node Redis Cluster, driven over
// real HTTP. Each end-to-end scenario is a test that asserts the numbers it
// measures and prints them (`go test -v ./e2e/`); README.md lists what each proves and
// the numbers measured. The pieces live in e2e/internal/harness.
package e2e

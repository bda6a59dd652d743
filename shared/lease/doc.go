// Package lease is the distributed half of Tollgate's decisions: how a gateway decides
// locally against a lease of the global quota (node.go), and the Go twin of the sync
// service's Lua that grants those leases (sync.go). Both sides are pure functions of an
// injected clock so the filter, the service tests and the fleet simulation run the same
// code. The protocol and its bounds are in RATIONALE.md §2–3.
package lease

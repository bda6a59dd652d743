// Package perf measures what an operator weighs when choosing a rate limiter: what a
// decision costs inside the proxy, how many checks one Redis carries, how many Redis
// round trips and bytes a request costs, and how far a fleet strays from its limit. Each
// measurement runs the real parts — the compiled filter in the internal/wazerohost wasm
// host, the sync service (ratelimit/service) on a real redis-server, the fleet simulation
// (bench/sim) — side by side with the per-request limiter most designs use
// (github.com/go-redis/redis_rate, one Redis round trip per request), in one process and
// on one Redis, so the numbers of one run compare with each other.
//
// The command bench/cmd/tollgate-bench (`make bench`) runs everything and writes
// BENCHMARKS.md and the charts in bench/charts; the Benchmark functions here measure
// the filter's decision cost under `go test -bench`. Timing claims live here and in
// BENCHMARKS.md, never in test assertions.
package perf

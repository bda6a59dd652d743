package sim

import (
	"testing"
	"time"
)

// BenchmarkRun measures the simulator itself (not Tollgate): simulated requests per
// second of wall time, for a fleet of 20 gateways and a Zipf population of 100k keys.
func BenchmarkRun(b *testing.B) {
	cfg := Config{Traffic: Zipf, Gateways: 20, Workers: 4, Keys: 100_000, Duration: 2 * time.Second}
	var reqs int64
	for b.Loop() {
		reqs += Run(cfg).Requests
	}
	b.ReportMetric(float64(reqs)/b.Elapsed().Seconds(), "requests/s")
}

package perf

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
)

// The admin-scale section on a real Redis: every sampled usage call finds the key's
// bucket and every reset deletes one, at each size. Sizes are small here;
// TOLLGATE_ADMIN_SIZES (comma-separated) runs the section alone at others, e.g.
// "1000,10000,100000,300000" as make bench does, and the log has the latencies.
func TestMeasureAdminScale(t *testing.T) {
	sizes := []int{1_000, 5_000}
	if env := os.Getenv("TOLLGATE_ADMIN_SIZES"); env != "" {
		sizes = nil
		for _, f := range strings.Split(env, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 100 {
				t.Fatalf("TOLLGATE_ADMIN_SIZES %q: want integers of at least 100", env)
			}
			sizes = append(sizes, n)
		}
	}
	rs := redistest.StartStandalone(t)
	svc, err := StartService(store.Standalone, rs.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	const samples = 50
	points, err := svc.MeasureAdminScale(context.Background(), sizes, samples)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range points {
		t.Logf("%7d keys (Redis %7d, filled in %v): usage p50 %v p99 %v; reset p50 %v p99 %v",
			p.Keys, p.RedisKeys, p.FillTime.Round(1e6), p.UsageP50, p.UsageP99, p.ResetP50, p.ResetP99)
		if p.FirstUsageErr != "" || p.FirstResetErr != "" {
			t.Errorf("%d keys: usage error %q, reset error %q", p.Keys, p.FirstUsageErr, p.FirstResetErr)
		}
		if p.UsageSampled != samples || p.UsageBuckets < samples {
			t.Errorf("%d keys: %d usage calls of %d found %d buckets, want one per key", p.Keys, p.UsageSampled, samples, p.UsageBuckets)
		}
		if p.ResetSampled != samples || p.ResetDeleted < samples {
			t.Errorf("%d keys: %d resets of %d deleted %d keys, want at least one each", p.Keys, p.ResetSampled, samples, p.ResetDeleted)
		}
		if p.RedisKeys < int64(p.Keys-p.ResetBefore) {
			t.Errorf("%d keys written, %d reset, Redis holds %d", p.Keys, p.ResetBefore, p.RedisKeys)
		}
	}
}

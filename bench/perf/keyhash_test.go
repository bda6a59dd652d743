package perf

import (
	"context"
	"testing"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
)

// TestMeasureKeyHashMemory: Redis memory per caller key, raw and hashed, side by side
// (run alone: go test -run TestMeasureKeyHashMemory ./bench/perf -v). Hashed keys must
// not cost more than raw IPv4 keys, the shortest IP keys there are.
func TestMeasureKeyHashMemory(t *testing.T) {
	rs := redistest.StartStandalone(t)
	svc, err := StartService(store.Standalone, rs.Addrs())
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	res, err := MeasureKeyHashMemory(context.Background(), svc.Store, 500)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range res {
		t.Logf("%s (%d keys): raw %.1f B per bucket (key name %.1f B), hashed %.1f B (key name %.1f B)",
			m.Keys, m.N, m.RawBytes, m.RawName, m.HashedBytes, m.HashedName)
		if m.HashedBytes > m.RawBytes {
			t.Errorf("%s: hashed keys cost %.1f B per bucket, raw %.1f B", m.Keys, m.HashedBytes, m.RawBytes)
		}
	}
}

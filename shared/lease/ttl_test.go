package lease

import (
	"testing"

	"github.com/tollgate-rl/tollgate/shared/wire"
)

func TestUseUs(t *testing.T) {
	const ttl, stale = 1_000_000, 10_000_000
	for _, tt := range []struct {
		name string
		d    wire.Delta
		want int64
	}{
		{"first report: no gap known", wire.Delta{Over: 1}, ttl},
		{"nothing consumed (a lease given back)", wire.Delta{Returned: 5, ElapsedMs: 1300}, ttl},
		{"hot key: 50 requests in 100 ms", wire.Delta{Leased: 50, ElapsedMs: 100}, ttl},
		{"eight a second: exactly the ttl", wire.Delta{Leased: 8, ElapsedMs: 1000}, ttl},
		{"a key back every second", wire.Delta{Over: 1, ElapsedMs: 1000}, 8_000_000},
		{"three over 2.4 s", wire.Delta{Leased: 2, Over: 1, ElapsedMs: 2400}, 6_400_000},
		{"a key back every 1.3 s: the staleness bound", wire.Delta{Over: 1, ElapsedMs: 1300}, stale},
		{"refusals count as requests", wire.Delta{Rejected: 4, ElapsedMs: 2000}, 4_000_000},
		{"a rate lease's use counts", wire.Delta{RateUsed: 2, ElapsedMs: 1000}, 4_000_000},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := UseUs(&tt.d, ttl, stale); got != tt.want {
				t.Fatalf("UseUs = %d, want %d", got, tt.want)
			}
		})
	}
}

package lease

import (
	"testing"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

func TestBatchRetry(t *testing.T) {
	const now, iv = 1_000_000_000, 100_000
	tb := algo.Params{Kind: algo.TokenBucket, Limit: 100, WindowUs: 1_000_000, Burst: 100} // a permit per 10 ms
	fw := algo.Params{Kind: algo.FixedWindow, Limit: 100, WindowUs: 1_000_000}
	for _, tt := range []struct {
		name      string
		p         algo.Params
		rejected  int64
		wantRetry int64 // 0: unchanged
	}{
		{"refused less than an interval's refill: left alone", tb, 9, 0},
		{"refused an interval's refill: held for an interval", tb, 10, now + iv},
		{"a window algorithm is never held", fw, 1000, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			in := Record{RetryUs: 5, GlobalRemaining: 7}
			out := BatchRetry(in, tt.p, tt.rejected, now, iv)
			if tt.wantRetry == 0 {
				if out.RetryUs != in.RetryUs || out.GlobalRemaining != in.GlobalRemaining {
					t.Fatalf("changed: %+v", out)
				}
				return
			}
			if out.RetryUs != tt.wantRetry || out.GlobalRemaining != 0 {
				t.Fatalf("retry %d remaining %d, want %d and 0", out.RetryUs, out.GlobalRemaining, tt.wantRetry)
			}
		})
	}
}

func TestAllowanceNodes(t *testing.T) {
	for _, tt := range []struct {
		name                      string
		heard, heardFor, expected int64
		want                      int64
	}{
		{"nothing heard, nothing expected: unknown", 0, 0, 0, 0},
		{"heard too briefly: unknown", 4, FleetSettleUs - 1, 0, 0},
		{"heard long enough", 4, FleetSettleUs, 0, 4},
		{"expected before the count settles", 2, 0, 3, 3},
		{"the larger of both", 5, FleetSettleUs, 3, 5},
		{"expected 1 says nothing", 0, 0, 1, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := AllowanceNodes(tt.heard, tt.heardFor, tt.expected); got != tt.want {
				t.Fatalf("got %d, want %d", got, tt.want)
			}
		})
	}
}

package lease

import "testing"

func TestBreaker(t *testing.T) {
	type step struct {
		at     int64
		op     string // "ok", "fail", "allow"
		want   bool   // for allow
		wantSt BreakerState
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"opens after consecutive failures", []step{
			{0, "fail", false, BreakerClosed},
			{1, "fail", false, BreakerClosed},
			{2, "allow", true, BreakerClosed},
			{2, "fail", false, BreakerOpen},
			{3, "allow", false, BreakerOpen},
		}},
		{"success resets the count", []step{
			{0, "fail", false, BreakerClosed},
			{1, "fail", false, BreakerClosed},
			{2, "ok", false, BreakerClosed},
			{3, "fail", false, BreakerClosed},
		}},
		{"half-open probe closes on success", []step{
			{0, "fail", false, BreakerClosed}, {0, "fail", false, BreakerClosed}, {0, "fail", false, BreakerOpen},
			{999, "allow", false, BreakerOpen},
			{1000, "allow", true, BreakerHalfOpen},
			{1001, "ok", false, BreakerClosed},
		}},
		{"half-open probe failure reopens", []step{
			{0, "fail", false, BreakerClosed}, {0, "fail", false, BreakerClosed}, {0, "fail", false, BreakerOpen},
			{1000, "allow", true, BreakerHalfOpen},
			{1001, "fail", false, BreakerOpen},
			{1500, "allow", false, BreakerOpen},
			{2001, "allow", true, BreakerHalfOpen},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &Breaker{Failures: 3, OpenUs: 1000}
			for i, s := range tt.steps {
				switch s.op {
				case "ok":
					b.Success()
				case "fail":
					b.Failure(s.at)
				case "allow":
					if got := b.Allow(s.at); got != s.want {
						t.Fatalf("step %d: allow(%d) = %v, want %v", i, s.at, got, s.want)
					}
				}
				if b.Healthy() != (s.wantSt == BreakerClosed) {
					t.Fatalf("step %d: healthy %v in state %v", i, b.Healthy(), b.State())
				}
				if b.State() != s.wantSt {
					t.Fatalf("step %d: state %v, want %v", i, b.State(), s.wantSt)
				}
			}
		})
	}
}

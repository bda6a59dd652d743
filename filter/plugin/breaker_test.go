package plugin

import "testing"

func TestBreaker(t *testing.T) {
	type step struct {
		at     int64
		op     string // "ok", "fail", "allow"
		want   bool   // for allow
		wantSt breakerState
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"opens after consecutive failures", []step{
			{0, "fail", false, breakerClosed},
			{1, "fail", false, breakerClosed},
			{2, "allow", true, breakerClosed},
			{2, "fail", false, breakerOpen},
			{3, "allow", false, breakerOpen},
		}},
		{"success resets the count", []step{
			{0, "fail", false, breakerClosed},
			{1, "fail", false, breakerClosed},
			{2, "ok", false, breakerClosed},
			{3, "fail", false, breakerClosed},
		}},
		{"half-open probe closes on success", []step{
			{0, "fail", false, breakerClosed}, {0, "fail", false, breakerClosed}, {0, "fail", false, breakerOpen},
			{999, "allow", false, breakerOpen},
			{1000, "allow", true, breakerHalfOpen},
			{1001, "ok", false, breakerClosed},
		}},
		{"half-open probe failure reopens", []step{
			{0, "fail", false, breakerClosed}, {0, "fail", false, breakerClosed}, {0, "fail", false, breakerOpen},
			{1000, "allow", true, breakerHalfOpen},
			{1001, "fail", false, breakerOpen},
			{1500, "allow", false, breakerOpen},
			{2001, "allow", true, breakerHalfOpen},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &breaker{failures: 3, openUs: 1000}
			for i, s := range tt.steps {
				switch s.op {
				case "ok":
					b.success()
				case "fail":
					b.failure(s.at)
				case "allow":
					if got := b.allow(s.at); got != s.want {
						t.Fatalf("step %d: allow(%d) = %v, want %v", i, s.at, got, s.want)
					}
				}
				if b.state != s.wantSt {
					t.Fatalf("step %d: state %v, want %v", i, b.state, s.wantSt)
				}
			}
		})
	}
}

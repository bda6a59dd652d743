package hostdelay

import (
	"testing"
	"time"
)

// TestWindow: an iteration counts for an interval when it overlaps it, so a stall that
// began before the interval and ended inside it is charged to it.
func TestWindow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	stopped := make(chan struct{})
	close(stopped)
	p := &Probe{done: stopped, samples: []delaySample{
		{at(0), at(6), 1 * time.Millisecond},
		{at(6), at(40), 29 * time.Millisecond}, // a stall
		{at(40), at(46), 1 * time.Millisecond},
		{at(46), at(52), 2 * time.Millisecond},
	}}
	tests := []struct {
		name              string
		from, to          int
		max, p50, stalled time.Duration
	}{
		// The median delay of all four iterations is 1 ms (nearest rank below the middle):
		// Stalled sums what each overlapping iteration waited beyond it.
		{"before any", -20, -10, 0, 0, 0},
		{"inside the first", 1, 2, time.Millisecond, time.Millisecond, 0},
		{"overlaps the stall's end", 30, 45, 29 * time.Millisecond, 1 * time.Millisecond, 28 * time.Millisecond},
		{"after the stall", 41, 60, 2 * time.Millisecond, 1 * time.Millisecond, 1 * time.Millisecond},
		{"all", 0, 60, 29 * time.Millisecond, 1 * time.Millisecond, 29 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := p.Max(at(tt.from), at(tt.to)); got != tt.max {
				t.Errorf("Max = %v, want %v", got, tt.max)
			}
			if got := p.Quantile(0.5, at(tt.from), at(tt.to)); got != tt.p50 {
				t.Errorf("Quantile(0.5) = %v, want %v", got, tt.p50)
			}
			if got := p.Stalled(at(tt.from), at(tt.to)); got != tt.stalled {
				t.Errorf("Stalled = %v, want %v", got, tt.stalled)
			}
		})
	}
}

// TestProbeRuns: a started probe records iterations, each no shorter than its sleep.
func TestProbeRuns(t *testing.T) {
	p, err := Start(2 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	from := time.Now()
	time.Sleep(100 * time.Millisecond)
	p.Close()
	n := len(p.within(from, time.Now()))
	if n == 0 {
		t.Fatal("no iteration recorded in 100 ms")
	}
	for _, s := range p.samples {
		if s.delay < 0 || s.end.Sub(s.start) < 2*time.Millisecond {
			t.Fatalf("iteration %v..%v delay %v: shorter than its sleep", s.start, s.end, s.delay)
		}
	}
	t.Logf("%d iterations, longest delay %v, median %v", n, p.Max(from, time.Now()), p.Quantile(0.5, from, time.Now()))
}

// TestReadWaitsForTheIterationInFlight: an interval read as soon as it ends includes the
// iteration running at its end (the one a host stall at that moment holds back), not
// only those already recorded.
func TestReadWaitsForTheIterationInFlight(t *testing.T) {
	p, err := Start(20 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	time.Sleep(2 * time.Millisecond)
	now := time.Now() // the first iteration is still asleep
	if n := len(p.within(now, now)); n != 1 {
		t.Fatalf("%d iterations overlap an interval read while the first was running, want it (1)", n)
	}
}

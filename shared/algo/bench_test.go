package algo

import "testing"

// benchParams is the benchmarks' window of kind k: 100 per minute, or for Calendar a
// month of 100 at +05:30 (its decisions find the month by day counting).
func benchParams(k Kind) Params {
	if k == Calendar {
		return CalendarParams(100, Month, 330)
	}
	return Params{Kind: k, Limit: 100, WindowUs: minute}
}

// BenchmarkDecide offers twice the allowed rate, so half the decisions admit.
func BenchmarkDecide(b *testing.B) {
	for _, k := range append(allKinds, Calendar) {
		b.Run(k.String(), func(b *testing.B) {
			p := benchParams(k)
			var s State
			now := int64(1_700_000_000_000_000)
			b.ReportAllocs()
			for b.Loop() {
				now += minute / 200
				r := Decide(p, s, now, 1)
				s = r.State
			}
		})
	}
}

func BenchmarkAvailable(b *testing.B) {
	for _, k := range append(allKinds, Calendar) {
		b.Run(k.String(), func(b *testing.B) {
			p := benchParams(k)
			now := int64(1_700_000_000_000_000)
			s := Take(p, nil, now, 50)
			b.ReportAllocs()
			for b.Loop() {
				Available(p, s, now+1000)
			}
		})
	}
}

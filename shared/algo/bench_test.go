package algo

import "testing"

// BenchmarkDecide offers twice the allowed rate, so half the decisions admit.
func BenchmarkDecide(b *testing.B) {
	for _, k := range allKinds {
		b.Run(k.String(), func(b *testing.B) {
			p := Params{Kind: k, Limit: 100, WindowUs: minute}
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
	for _, k := range allKinds {
		b.Run(k.String(), func(b *testing.B) {
			p := Params{Kind: k, Limit: 100, WindowUs: minute}
			now := int64(1_700_000_000_000_000)
			s := Take(p, nil, now, 50)
			b.ReportAllocs()
			for b.Loop() {
				Available(p, s, now+1000)
			}
		})
	}
}

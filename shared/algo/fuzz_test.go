package algo

import (
	"testing"
)

// wellFormed reports whether s decodes as a state of n's algorithm (the empty state
// included) without falling back to fresh.
func wellFormed(n norm, s State, now int64) bool {
	if len(s) == 0 {
		return true
	}
	switch n.kind {
	case SlidingWindowLog:
		_, ok := logDecode(s, nil)
		return ok
	case SlidingWindowCounter:
		_, ok := loadStart(n, s, swcLen, floorDiv(now, n.win)*n.win)
		return ok
	case FixedWindow:
		_, ok := loadStart(n, s, fwLen, floorDiv(now, n.win)*n.win)
		return ok
	case Calendar:
		return !calLoad(n, s, now).moved
	default:
		return len(s) == tatLen && s[0] == stateTag(n.kind) && validTime(int64(le.Uint64(s[1:])))
	}
}

// FuzzState feeds arbitrary bytes as state, arbitrary (clamped) params, times and costs
// to every function: nothing may panic, and every state written must decode again.
func FuzzState(f *testing.F) {
	seeds := []struct {
		s    []byte
		kind uint8
	}{
		{nil, 0},
		{Take(Params{Limit: 10, WindowUs: second}, nil, 5, 3), uint8(TokenBucket)},
		{Take(Params{Kind: GCRA, Limit: 3, WindowUs: second}, nil, 5, 7), uint8(GCRA)},
		{Take(Params{Kind: FixedWindow, Limit: 10, WindowUs: second}, nil, 5, 3), uint8(FixedWindow)},
		{Take(Params{Kind: SlidingWindowCounter, Limit: 10, WindowUs: second}, nil, 5, 3), uint8(SlidingWindowCounter)},
		{Take(Params{Kind: SlidingWindowLog, Limit: 10, WindowUs: second}, Take(Params{Kind: SlidingWindowLog, Limit: 10, WindowUs: second}, nil, 5, 3), 900, 2), uint8(SlidingWindowLog)},
		{[]byte{0x12, 0, 0, 0, 0, 0, 0, 0, 0, 0x80}, uint8(SlidingWindowLog)},
		{[]byte{0x10, 1, 2, 3}, uint8(TokenBucket)},
		{Take(CalendarParams(10, Month, 330), nil, 5, 3), uint8(Calendar)},
	}
	for _, sd := range seeds {
		f.Add(sd.s, sd.kind, int64(10), second, int64(0), int64(1_000), int64(1))
	}
	f.Add([]byte(Take(CalendarParams(3, Week, -480), nil, 1_700_000_000_000_000, 3)), uint8(Calendar), int64(3), int64(7*DayUs), int64(20960), int64(1_700_000_100_000_000), int64(1))
	f.Fuzz(func(t *testing.T, s []byte, kind uint8, limit, window, burst, now, cost int64) {
		p := Params{Kind: Kind(kind % 7), Limit: limit, WindowUs: window, Burst: burst}
		n := p.norm()
		now %= MaxTimeUs
		capa := p.Capacity()
		a := Available(p, s, now)
		if a > capa {
			t.Fatalf("Available %d above capacity %d", a, capa)
		}
		r := Decide(p, s, now, cost)
		if r.Allowed != (max(cost, 0) <= a) {
			t.Fatalf("Decide(%d) allowed=%v with %d available", cost, r.Allowed, a)
		}
		if r.RetryAfterUs < 0 || (r.RetryAfterUs == 0) != r.Allowed || r.Remaining < 0 {
			t.Fatalf("Decide(%d) = %+v", cost, r)
		}
		if ra := RetryAfter(p, s, now, cost); ra < 0 {
			t.Fatalf("RetryAfter(%d) = %d", cost, ra)
		}
		if rs := ResetAt(p, s, now); rs < now {
			t.Fatalf("ResetAt %d before now %d", rs, now)
		}
		written := []State{r.State, Take(p, s, now, cost), Refund(p, s, now, cost)}
		if !r.Allowed {
			written = written[1:] // a rejection may hand s back untouched
		}
		for i, w := range written {
			if !wellFormed(n, w, now) {
				t.Fatalf("state %d written as %x does not decode", i, w)
			}
			if len(w) > p.MaxStateLen() {
				t.Fatalf("state %d of %d bytes above MaxStateLen %d", i, len(w), p.MaxStateLen())
			}
		}
	})
}

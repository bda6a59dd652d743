package algo

import (
	"bytes"
	"encoding/hex"
	"math/rand"
	"testing"
)

// TestEncodingLayout pins the byte layout documented in ENCODING.md: the Lua scripts
// and states already stored in Redis depend on it.
func TestEncodingLayout(t *testing.T) {
	tests := []struct {
		name string
		s    State
		want string
	}{
		// tat = 1000 + 4·(1,000,000/3) = 1,334,333⅓: tat 1334333 (0x145c3d), frac 1 of 3.
		{"token_bucket", Take(Params{Limit: 3, WindowUs: second}, nil, 1000, 4), "10" + "3d5c140000000000" + "01000000"},
		{"gcra", Take(Params{Kind: GCRA, Limit: 3, WindowUs: second}, nil, 1000, 4), "11" + "3d5c140000000000" + "01000000"},
		// window [2 s, 3 s), count 5.
		{"fixed_window", Take(Params{Kind: FixedWindow, Limit: 10, WindowUs: second}, nil, 2*second+7, 5), "14" + "80841e0000000000" + "05000000"},
		// window [2 s, 3 s), curr 0, prev 5 (taken in [1 s, 2 s)).
		{"sliding_window_counter", Take(Params{Kind: SlidingWindowCounter, Limit: 10, WindowUs: second}, Take(Params{Kind: SlidingWindowCounter, Limit: 10, WindowUs: second}, nil, second, 5), 2*second, 0), "13" + "80841e0000000000" + "00000000" + "05000000"},
		// runs (1000, 2) and (1300, 1): base 1000, then (delta 0, count 2), (delta 300 = ac 02, count 1).
		{"sliding_window_log", Take(Params{Kind: SlidingWindowLog, Limit: 10, WindowUs: second}, Take(Params{Kind: SlidingWindowLog, Limit: 10, WindowUs: second}, nil, 1000, 2), 1300, 1), "12" + "e803000000000000" + "0002" + "ac0201"},
		{"empty_log_is_fresh", Refund(Params{Kind: SlidingWindowLog, Limit: 10, WindowUs: second}, Take(Params{Kind: SlidingWindowLog, Limit: 10, WindowUs: second}, nil, 1000, 2), 1000, 2), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := hex.EncodeToString(tt.s); got != tt.want {
				t.Errorf("encoded %s, want %s", got, tt.want)
			}
		})
	}
}

// TestEncodingRoundTrip: decoding a state at a time where nothing needs to move and
// encoding it again gives back the same bytes, for every algorithm.
func TestEncodingRoundTrip(t *testing.T) {
	for _, k := range allKinds {
		t.Run(k.String(), func(t *testing.T) {
			rng := rand.New(rand.NewSource(int64(k)))
			for range 2000 {
				p := randParams(rng, k)
				n := p.norm()
				now := rng.Int63n(MaxTimeUs)
				var s, again State
				switch k {
				case FixedWindow:
					st := fwState{start: floorDiv(now, n.win) * n.win, count: rng.Int63n(MaxCount + 1)}
					s = fwEncode(nil, k, st)
					again = fwEncode(nil, k, fwLoad(n, s, now))
				case SlidingWindowCounter:
					st := swcState{start: floorDiv(now, n.win) * n.win, curr: rng.Int63n(MaxCount + 1), prev: rng.Int63n(MaxCount + 1)}
					s = swcEncode(nil, k, st)
					again = swcEncode(nil, k, swcLoad(n, s, now))
				case SlidingWindowLog:
					var runs []logRun
					ts := now - n.win + 1
					for range rng.Intn(int(n.lim) + 1) {
						ts += rng.Int63n(n.win/n.lim + 1)
						runs = append(runs, logRun{ts: ts, n: 1 + rng.Int63n(MaxCount)})
					}
					s = logEncode(n, runs)
					var buf [16]logRun
					loaded, moved := logLoad(n, s, now, buf[:])
					if moved {
						t.Fatalf("%+v: log %x moved on load", p, s)
					}
					again = logEncode(n, loaded)
				default:
					st := tatState{tat: now + rng.Int63n(MaxAheadUs), frac: rng.Int63n(n.lim)}
					s = tatEncode(nil, k, st)
					again = tatEncode(nil, k, tatLoad(n, s, now))
				}
				if !bytes.Equal(s, again) {
					t.Fatalf("%+v at %d: %x re-encoded as %x", p, now, s, again)
				}
				if len(s) > p.MaxStateLen() {
					t.Fatalf("%+v: %d bytes above MaxStateLen %d", p, len(s), p.MaxStateLen())
				}
			}
		})
	}
}

// TestLogMerge: beyond Limit+LogSlack runs the oldest are merged into the newest of
// them, which keeps permits counted longer, never shorter.
func TestLogMerge(t *testing.T) {
	p := Params{Kind: SlidingWindowLog, Limit: 2, WindowUs: second}
	var s State
	for i := range int64(100) {
		s = Take(p, s, i*1000, 1)
	}
	var buf [16]logRun
	runs, _ := logLoad(p.norm(), s, 99_000, buf[:])
	if len(runs) != 2+LogSlack {
		t.Fatalf("%d runs, want %d", len(runs), 2+LogSlack)
	}
	if got := Available(p, s, 99_000); got != 2-100 {
		t.Fatalf("Available = %d, want -98", got)
	}
	// The merged run sits at the time of the newest merged take, (100-66)·1000 µs.
	if runs[0].ts != 34_000 || runs[0].n != 35 {
		t.Fatalf("merged run = %+v, want {34000 35}", runs[0])
	}
}

func TestAllocations(t *testing.T) {
	for _, k := range allKinds {
		p := Params{Kind: k, Limit: 100, WindowUs: minute}
		s := Take(p, nil, 10, 100)
		t.Run(k.String(), func(t *testing.T) {
			if n := testing.AllocsPerRun(100, func() {
				Available(p, s, 20)
				RetryAfter(p, s, 20, 1)
				ResetAt(p, s, 20)
				Decide(p, s, 20, 1) // rejected: the state is handed back as is
			}); n != 0 {
				t.Errorf("%v allocations per read-only call set, want 0", n)
			}
			if n := testing.AllocsPerRun(100, func() { Take(p, s, 20, 1) }); n > 1 {
				t.Errorf("Take allocates %v times, want at most 1", n)
			}
		})
	}
}

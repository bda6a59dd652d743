package rule

import (
	"errors"
	"math/big"
	"strconv"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

// windowDoc is a rule set of one rule with one window; the window is written in
// integer milliseconds or as a duration string.
func windowDoc(kind algo.Kind, limit, windowUs, burst int64, withBurst, asString bool) string {
	w := strconv.FormatInt(windowUs/1000, 10)
	if asString {
		w = strconv.Quote(formatUs(windowUs))
	}
	doc := `{"rules":[{"id":"r","algorithm":"` + AlgorithmName(kind) + `","limit":` + strconv.FormatInt(limit, 10) + `,"window":` + w
	if withBurst {
		doc += `,"burst":` + strconv.FormatInt(burst, 10)
	}
	return doc + `}]}`
}

// checkAgrees asserts the parser accepts a window exactly when algo.Params.Validate
// does, and that a refusal names first the field Validate names. Windows are whole
// milliseconds and burst is only written for token_bucket and gcra: those are the
// parser's two checks of meaning (what the wire carries, what the algorithm uses),
// tested by their own fixtures.
func checkAgrees(t *testing.T, kind algo.Kind, limit, windowUs, burst int64, withBurst, asString bool) {
	t.Helper()
	doc := windowDoc(kind, limit, windowUs, burst, withBurst, asString)
	p := algo.Params{Kind: kind, Limit: limit, WindowUs: windowUs, Burst: burst}
	verr := p.Validate()
	c, err := Parse([]byte(doc))
	switch {
	case verr == nil && err != nil:
		t.Fatalf("%s: Validate accepts %+v, Parse refuses: %v", doc, p, err)
	case verr != nil && err == nil:
		t.Fatalf("%s: Parse accepts, Validate refuses: %v", doc, verr)
	case verr == nil:
		if got := c.Rules[0].Windows[0]; got != p {
			t.Fatalf("%s: parsed %+v, want %+v", doc, got, p)
		}
		return
	}
	var pe *algo.ParamError
	var fe *FieldError
	if !errors.As(verr, &pe) || !errors.As(err, &fe) {
		t.Fatalf("%s: errors %v / %v", doc, verr, err)
	}
	if want := "rules[0]." + pe.Field; fe.Field != want {
		t.Fatalf("%s: Parse names %q (%v), Validate names %q (%v)", doc, fe.Field, err, want, verr)
	}
	// Parse goes on past the first mistake: every other error names another field of
	// the window (TestWindowReportsEveryError has the exact lists).
	seen := map[string]bool{}
	for _, e := range All(err) {
		switch e.Field {
		case "rules[0].limit", "rules[0].window", "rules[0].burst":
		default:
			t.Fatalf("%s: error %v names no field of the window", doc, e)
		}
		if seen[e.Field] {
			t.Fatalf("%s: %s named twice: %v", doc, e.Field, err)
		}
		seen[e.Field] = true
	}
}

// refillBound is the largest capacity Validate allows a token bucket of limit per
// windowUs (algo.MaxRefillUs × limit / window), computed exactly.
func refillBound(limit, windowUs int64) int64 {
	m := new(big.Int).Mul(big.NewInt(algo.MaxRefillUs), big.NewInt(limit))
	m.Quo(m, big.NewInt(windowUs))
	if !m.IsInt64() {
		return 1<<63 - 1
	}
	return m.Int64()
}

// TestWindowBoundsAgreeWithAlgo walks every bound of every algorithm — limit 1 and
// algo.MaxLimit (MaxLogLimit for the log), the shortest and longest window, the one
// permit per µs ratio, maximum burst and the refill bound — one step inside and one
// outside each.
func TestWindowBoundsAgreeWithAlgo(t *testing.T) {
	ms := func(us int64) int64 { return us / 1000 * 1000 }
	for _, kind := range Algorithms() {
		limits := []int64{-1, 0, 1, 2, 999, 1000, 1001, algo.MaxLimit - 1, algo.MaxLimit, algo.MaxLimit + 1,
			algo.MaxLogLimit - 1, algo.MaxLogLimit, algo.MaxLogLimit + 1}
		for _, limit := range limits {
			windows := []int64{0, algo.MinWindowUs - 1000, algo.MinWindowUs, algo.MinWindowUs + 1000,
				algo.MaxWindowUs - 1000, algo.MaxWindowUs, algo.MaxWindowUs + 1000, 3_600_000_000,
				ms(limit) - 1000, ms(limit), ms(limit) + 1000, ms(limit + 999)}
			for _, w := range windows {
				for _, asString := range []bool{false, true} {
					if w <= 0 && asString {
						continue // "0s" and negative durations: the integer form covers them
					}
					checkAgrees(t, kind, limit, w, 0, false, asString)
				}
				if !kind.HasBurst() || w <= 0 || limit <= 0 {
					continue
				}
				rb := refillBound(limit, w)
				for _, b := range []int64{-1, 0, 1, limit, algo.MaxBurst - 1, algo.MaxBurst, algo.MaxBurst + 1, rb - 1, rb, rb + 1} {
					checkAgrees(t, kind, limit, w, b, true, false)
				}
			}
		}
	}
}

// FuzzWindowBounds is TestWindowBoundsAgreeWithAlgo on arbitrary windows.
func FuzzWindowBounds(f *testing.F) {
	f.Add(uint8(0), int64(algo.MaxLimit), int64(algo.MaxWindowUs/1000), int64(algo.MaxBurst))
	f.Add(uint8(1), int64(1), int64(algo.MaxWindowUs/1000), int64(algo.MaxBurst))
	f.Add(uint8(2), int64(algo.MaxLogLimit+1), int64(1), int64(0))
	f.Add(uint8(3), int64(1001), int64(1), int64(0))
	f.Add(uint8(4), int64(5_000_000), int64(86_400_000), int64(0))
	f.Fuzz(func(t *testing.T, k uint8, limit, windowMs, burst int64) {
		kind := Algorithms()[int(k)%len(Algorithms())]
		if windowMs > (1<<63-1)/1000 || windowMs < -(1<<63-1)/1000 {
			return
		}
		withBurst := kind.HasBurst()
		if !withBurst {
			burst = 0
		}
		checkAgrees(t, kind, limit, windowMs*1000, burst, withBurst, false)
	})
}

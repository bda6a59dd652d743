package algo

import (
	"math/big"
	"math/rand/v2"
	"testing"
)

// TestMulDivRemExact checks mulDivRem against exact arithmetic on both of its paths: a
// product that fits 64 bits (one machine division) and one that does not (bits.Div64),
// at the edges between them and at random.
func TestMulDivRemExact(t *testing.T) {
	type tc struct{ a, b, c int64 }
	cases := []tc{
		{1, 1, 1}, {7, 3, 2}, {1 << 31, 1 << 31, 3}, {1<<32 - 1, 1<<32 - 1, 7},
		{1 << 32, 1 << 32, 1 << 42}, // 2^64: the first product that needs 128 bits
		{1<<63 - 1, 1, 1 << 40}, {1<<63 - 1, 2, 1<<42 - 1}, {MaxRefillUs, MaxLimit, MaxWindowUs},
		{MaxRefillUs, MaxLimit, MinWindowUs * 1000}, {3_000_000_000, 6_000_000_001, 1_000_003},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20_000; i++ {
		// products on both sides of 2^64, divisors up to 2^42, quotients below 2^53
		c := rng.Int64N(1<<42) + 1
		a := rng.Int64N(1 << (1 + rng.IntN(62)))
		b := rng.Int64N(1 << (1 + rng.IntN(62)))
		cases = append(cases, tc{a, b, c})
	}
	for _, x := range cases {
		p := new(big.Int).Mul(big.NewInt(x.a), big.NewInt(x.b))
		wq, wr := new(big.Int).QuoRem(p, big.NewInt(x.c), new(big.Int))
		q, r := mulDivRem(x.a, x.b, x.c)
		if !wq.IsInt64() || wq.Int64() >= maxExact || x.a <= 0 || x.b <= 0 {
			continue // outside the documented range (saturates or answers 0)
		}
		if q != wq.Int64() || r != wr.Int64() {
			t.Fatalf("mulDivRem(%d, %d, %d) = %d, %d; want %s, %s", x.a, x.b, x.c, q, r, wq, wr)
		}
	}
}

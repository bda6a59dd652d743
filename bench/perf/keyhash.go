package perf

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"

	"github.com/tollgate-rl/tollgate/ratelimit/service"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// KeyHashMem compares Redis memory per caller key stored raw and as the service's keyed
// hash (service.HashKey), for one family of keys.
type KeyHashMem struct {
	Keys string // what the caller keys are ("IPv4", "IPv6")
	N    int
	// RawBytes and HashedBytes are the mean MEMORY USAGE of a caller's bucket, raw and
	// hashed; RawName and HashedName the mean length of its Redis key's name.
	RawBytes, HashedBytes float64
	RawName, HashedName   float64
}

// MeasureKeyHashMemory syncs one token-bucket bucket (rule "api", 100 per 60 s, an
// acquire and a report of 3 permits, as a gateway does) for n random IPv4 and n random
// IPv6 caller keys, once stored raw and once stored hashed (store.Options.StoreKey, as
// the service does with a key-hash secret), and reads MEMORY USAGE of each bucket.
func MeasureKeyHashMemory(ctx context.Context, st *store.Store, n int) ([]KeyHashMem, error) {
	rng := rand.New(rand.NewPCG(1, 2))
	secret := []byte("bench-key-hash-secret")
	hashed := func(k string) string { return service.HashKey(secret, k) }
	families := []struct {
		name string
		gen  func() string
	}{
		{"IPv4", func() string {
			var a [4]byte
			for i := range a {
				a[i] = byte(rng.IntN(256))
			}
			return netip.AddrFrom4(a).String()
		}},
		{"IPv6", func() string {
			var a [16]byte
			a[0], a[1] = 0x20, 0x01
			for i := 2; i < 16; i++ {
				a[i] = byte(rng.IntN(256))
			}
			return netip.AddrFrom16(a).String()
		}},
	}
	var out []KeyHashMem
	for fi, f := range families {
		m := KeyHashMem{Keys: f.name, N: n}
		for i := 0; i < n; i++ {
			key := f.gen()
			for _, storeKey := range []func(string) string{nil, hashed} {
				o := store.Options{StoreKey: storeKey}
				node := fmt.Sprintf("keyhash-gw-%d-%d", fi, i)
				d := wire.Delta{Key: key, Rule: "api", Flags: wire.FlagAcquire, Over: 1, ElapsedMs: 100,
					Algo: uint8(algo.TokenBucket), Limit: 100, WindowMs: 60_000}
				res, err := st.Apply(ctx, &wire.Batch{Node: node, Seq: 1, Deltas: []wire.Delta{d}}, o)
				if err != nil {
					return nil, fmt.Errorf("key hash memory: %w", err)
				}
				got := res.States[0]
				d = wire.Delta{Key: key, Rule: "api", Leased: min(3, got.Lease), Held: got.Lease - min(3, got.Lease), Epoch: got.Epoch,
					ElapsedMs: 1000, Algo: uint8(algo.TokenBucket), Limit: 100, WindowMs: 60_000}
				o.Idempotent = true
				if _, err := st.Apply(ctx, &wire.Batch{Node: node, Seq: 2, Deltas: []wire.Delta{d}}, o); err != nil {
					return nil, fmt.Errorf("key hash memory: %w", err)
				}
				sk := key
				if storeKey != nil {
					sk = storeKey(key)
				}
				bytes, err := st.MemoryUsage(ctx, sk, "api", "", 0)
				if err != nil {
					return nil, fmt.Errorf("MEMORY USAGE: %w", err)
				}
				name := float64(len(store.BucketKey(sk, "api", "", 0))) / float64(n)
				if storeKey == nil {
					m.RawBytes += float64(bytes) / float64(n)
					m.RawName += name
				} else {
					m.HashedBytes += float64(bytes) / float64(n)
					m.HashedName += name
				}
			}
		}
		out = append(out, m)
	}
	return out, nil
}

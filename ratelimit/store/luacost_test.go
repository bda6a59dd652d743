package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// BenchmarkLuaPerDelta measures the lease script's Redis CPU per delta (INFO
// commandstats: usec of EVALSHA over the deltas it applied) on the shared standalone
// server, one batch of 100 buckets per call, for the deltas a gateway sends:
//
//   - report: consumption within a lease the gateway keeps (Leased, Held, Epoch), what a
//     slow key's or a renewing key's report is;
//   - acquire: a paused request's FlagAcquire delta on a bucket with leases out;
//   - acquire1: the same, one delta per script call (what a paused request sends);
//   - first: a bucket's first delta (nothing stored yet).
//
// Run it with
//
//	go test -run '^$' -bench LuaPerDelta -benchtime 200x ./ratelimit/store
//
// The metrics are "us/delta", Redis's own accounting of the script's time (wall time
// inside the command, which excludes the network but counts the time Redis waits for a
// core on a busy machine), and "cpu-us/delta", the server's whole CPU time over the run
// (idle work included) per delta.
func BenchmarkLuaPerDelta(b *testing.B) {
	for _, kind := range []string{"report", "acquire", "acquire1", "first"} {
		b.Run(kind, func(b *testing.B) {
			s, _ := newStore(b, Standalone, nil)
			ctx := context.Background()
			n := 100
			if kind == "acquire1" {
				n = 1 // one acquire per script call, as a paused request sends it
			}
			prefix := "lc" + strconv.FormatInt(int64(b.N), 36) + kind
			delta := func(i int) wire.Delta {
				return wire.Delta{Key: prefix + strconv.Itoa(i), Rule: "api", Algo: uint8(algo.GCRA),
					Limit: 1000, WindowMs: 1000, Burst: 1000}
			}
			// Grant every bucket a lease first (one demand sample of 100 permits over
			// 100 ms), then report within it.
			epochs := make([]uint32, n)
			held := make([]uint32, n)
			seq := uint64(1)
			if kind != "first" {
				batch := wire.Batch{Node: "gw-cost", Seq: seq}
				for i := range n {
					d := delta(i)
					d.Leased, d.ElapsedMs = 100, 100
					batch.Deltas = append(batch.Deltas, d)
				}
				out, err := s.Apply(ctx, &batch, Options{Idempotent: true})
				if err != nil {
					b.Fatal(err)
				}
				for i, st := range out.States {
					epochs[i], held[i] = st.Epoch, st.Lease+st.Held
				}
			}
			usec0, calls0 := evalshaUsec(b, s)
			cpu0 := redisCPU(b, s)
			deltas := 0
			b.ResetTimer()
			for it := range b.N {
				seq++
				batch := wire.Batch{Node: "gw-cost", Seq: seq}
				for i := range n {
					d := delta(i)
					switch kind {
					case "report":
						d.Leased, d.Epoch, d.ElapsedMs = 1, epochs[i], 1000
						if held[i] > 0 {
							held[i]--
						}
						d.Held = held[i]
					case "acquire", "acquire1":
						d.Flags, d.Over, d.Epoch, d.ElapsedMs = wire.FlagAcquire, 1, epochs[i], 100
					case "first":
						d.Key += "-" + strconv.Itoa(it)
						d.Leased, d.ElapsedMs = 1, 0
					}
					batch.Deltas = append(batch.Deltas, d)
				}
				out, err := s.Apply(ctx, &batch, Options{Idempotent: kind == "report"})
				if err != nil {
					b.Fatal(err)
				}
				if kind == "report" {
					for i, st := range out.States {
						held[i] = st.Held + st.Lease
						if st.Held+st.Lease > 0 {
							epochs[i] = st.Epoch
						}
					}
				}
				deltas += n
			}
			b.StopTimer()
			usec1, calls1 := evalshaUsec(b, s)
			b.ReportMetric(float64(usec1-usec0)/float64(deltas), "us/delta")
			b.ReportMetric((redisCPU(b, s)-cpu0)*1e6/float64(deltas), "cpu-us/delta")
			b.ReportMetric(float64(calls1-calls0)/float64(b.N), "calls/op")
		})
	}
}

// redisCPU reads the server process's CPU time (s, user and system: INFO cpu, from
// getrusage), which, unlike commandstats' wall time, leaves out the time Redis waits for
// a core.
func redisCPU(b *testing.B, s *Store) float64 {
	b.Helper()
	info, err := s.Client().Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var t float64
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_user" || k == "used_cpu_sys" {
			x, _ := strconv.ParseFloat(v, 64)
			t += x
		}
	}
	return t
}

// evalshaUsec reads the server's total EVALSHA time (µs) and calls.
func evalshaUsec(b *testing.B, s *Store) (usec, calls int64) {
	b.Helper()
	info, err := s.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_evalsha:") {
			continue
		}
		for _, f := range strings.Split(strings.TrimSpace(strings.TrimPrefix(line, "cmdstat_evalsha:")), ",") {
			k, v, _ := strings.Cut(f, "=")
			x, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "usec":
				usec = x
			case "calls":
				calls = x
			}
		}
	}
	return usec, calls
}

// A batch recorded by the script before its idempotency records were packed
// ("<seq>:<now>:<lease fields, comma-separated>"), or packed before rate leases
// ("<seq>;<now>;" and five fields per delta), is still replayed: a gateway that resends
// it across the service's upgrade gets the grant it lost, not a second one.
func TestReplayOfUnpackedRecord(t *testing.T) {
	formats := map[string]func(r lease.SyncResult) string{
		"text": func(r lease.SyncResult) string {
			return fmt.Sprintf("9:%d:%d,%d,%d,%d,%d", r.NowUs, r.Grant, r.Held, r.Epoch, r.ValidUs, r.LowWater)
		},
		"packed without rate": func(r lease.SyncResult) string {
			b := fmt.Appendf(nil, "9;%d;", r.NowUs)
			b = binary.LittleEndian.AppendUint32(b, uint32(r.Grant))
			b = binary.LittleEndian.AppendUint32(b, uint32(r.Held))
			b = binary.LittleEndian.AppendUint32(b, r.Epoch)
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(float64(r.ValidUs)))
			b = binary.LittleEndian.AppendUint32(b, uint32(r.LowWater))
			return string(b)
		},
	}
	for _, mode := range modes {
		for fname, format := range formats {
			t.Run(string(mode)+"/"+fname, func(t *testing.T) {
				s, _ := clockedStore(t, mode, nil)
				ctx := context.Background()
				node := uniq("gw:old")
				b := &wire.Batch{Node: node, Seq: 9}
				d := mkDelta(algo.GCRA, uniq("old"), "api")
				d.Leased, d.ElapsedMs = 10, 100
				b.Deltas = append(b.Deltas, d)
				first, err := s.Apply(ctx, b, Options{Idempotent: true})
				if err != nil {
					t.Fatal(err)
				}
				r := first.Results[0]
				if r.Grant == 0 {
					t.Fatalf("no grant to replay: %+v", r)
				}
				slot := 0
				if mode == Cluster {
					groups, err := s.plan(ctx, b, storeKeys(&Options{}, b), []bool{true})
					if err != nil {
						t.Fatal(err)
					}
					slot = groups[0].slot
				}
				old := format(r)
				if err := s.rdb.HSet(ctx, idemKey(slot, node), "0", old).Err(); err != nil {
					t.Fatal(err)
				}
				again, err := s.Apply(ctx, b, Options{Idempotent: true})
				if err != nil {
					t.Fatal(err)
				}
				g := again.Results[0]
				if !g.Replay || g.Grant != r.Grant || g.Held != r.Held || g.Epoch != r.Epoch || g.ValidUs != r.ValidUs || g.LowWater != r.LowWater || g.NowUs != r.NowUs {
					t.Fatalf("replay of the old record: %+v, want the lease fields of %+v", g, r)
				}
			})
		}
	}
}

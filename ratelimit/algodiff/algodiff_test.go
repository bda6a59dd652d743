// Package algodiff checks that the Lua fragments the sync service embeds
// (ratelimit/store/scripts/algo_*.lua) compute exactly what shared/algo computes: the
// same state bytes and the same numbers at every step, run inside a real redis-server.
// shared/ cannot import Redis, so the differential test lives here.
package algodiff

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
)

// harness runs a sequence of operations through the fragment's functions. ARGV: limit,
// window_us, burst, initial state, then (op, now, n) triples with op d(ecide), t(ake) or
// r(efund). Before each op it reports available, reset_at and retry_after(n) of the
// current state. Every number is checked to be an exact integer, so a fraction or a
// value beyond 2^53 fails loudly instead of being truncated into an integer reply.
const harness = `
local function algo__int(x)
  if type(x) ~= 'number' or x ~= math.floor(x) or x >= 2^53 or x <= -2^53 then
    error('not an exact integer: ' .. tostring(x))
  end
  return x
end
local p = {limit = tonumber(ARGV[1]), window_us = tonumber(ARGV[2]), burst = tonumber(ARGV[3])}
local st = ARGV[4]
local out = {}
for i = 5, #ARGV, 3 do
  local op, now, n = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local row = {algo__int(algo_available(p, st, now)), algo__int(algo_reset_at(p, st, now)),
    algo__int(algo_retry_after(p, st, now, n))}
  if op == 'd' then
    local allowed, st2, rem, reset, retry = algo_decide(p, st, now, n)
    row[4], row[5], row[6], row[7] = algo__int(allowed), algo__int(rem), algo__int(reset), algo__int(retry)
    st = st2
  elseif op == 't' then
    st = algo_take(p, st, now, n)
  else
    st = algo_refund(p, st, now, n)
  end
  if type(st) ~= 'string' then error('state is a ' .. type(st)) end
  row[#row + 1] = st
  out[#out + 1] = row
end
return out
`

type step struct {
	op     byte
	now, n int64
}

// apply is the step in Go: 'd' Decide, 't' Take, anything else Refund.
func (s step) apply(p algo.Params, st algo.State) algo.State {
	switch s.op {
	case 'd':
		return algo.Decide(p, st, s.now, s.n).State
	case 't':
		return algo.Take(p, st, s.now, s.n)
	default:
		return algo.Refund(p, st, s.now, s.n)
	}
}

// startRedis starts a standalone redis-server for the test (internal/redistest): a
// missing redis-server fails the test, as everywhere in make test, which installs it.
func startRedis(t *testing.T) *redis.Client {
	t.Helper()
	srv := redistest.StartStandalone(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// randParams mixes valid rules (small and extreme) with out-of-range ones, which both
// sides must clamp identically.
func randParams(rng *rand.Rand, k algo.Kind) algo.Params {
	if k.CalendarPeriods() {
		return randCalendar(rng)
	}
	limits := []int64{1, 2, 3, 7, 10, 100, 999, algo.MaxLogLimit, 12_345, 5_000_000, algo.MaxLimit}
	windows := []int64{algo.MinWindowUs, 7_919, 1_000_000, 60_000_000, 3_600_000_000, algo.MaxWindowUs}
	p := algo.Params{Kind: k, Limit: limits[rng.Intn(len(limits))], WindowUs: windows[rng.Intn(len(windows))]}
	if rng.Intn(3) == 0 {
		p.WindowUs = algo.MinWindowUs + rng.Int63n(algo.MaxWindowUs)
	}
	if !k.FixedSizeState() && p.Limit > 1000 && rng.Intn(2) == 0 {
		p.Limit = 1 + rng.Int63n(50) // keep logs whose size matters
	}
	switch rng.Intn(6) {
	case 0:
		p.Burst = 1 + rng.Int63n(3*p.Limit)
	case 1:
		p.Burst = rng.Int63n(algo.MaxBurst + 1)
	}
	if rng.Intn(12) == 0 {
		bad := []int64{-5, 0, 5, 999, 1 << 40, 1 << 62, -1 << 62}
		switch rng.Intn(3) {
		case 0:
			p.Limit = bad[rng.Intn(len(bad))]
		case 1:
			p.WindowUs = bad[rng.Intn(len(bad))]
		default:
			p.Burst = bad[rng.Intn(len(bad))]
		}
	}
	return p
}

// calendarOffsets are UTC offsets (minutes) at and around the bounds and in use.
var calendarOffsets = []int64{0, 0, 60, -60, 330, 345, -480, -210, algo.MaxOffsetMinutes, -algo.MaxOffsetMinutes, 1, -1}

// randCalendar is a calendar window of a random period and offset; one in twelve has an
// encoding Validate refuses (which both sides must clamp identically).
func randCalendar(rng *rand.Rand) algo.Params {
	limits := []int64{1, 2, 3, 10, 100, 1_000_000, algo.MaxLimit}
	p := algo.CalendarParams(limits[rng.Intn(len(limits))], algo.Period(1+rng.Intn(3)), calendarOffsets[rng.Intn(len(calendarOffsets))])
	if rng.Intn(12) == 0 {
		bad := []int64{-5, 0, 5, 10599, 32281, 19999, 40000, 1 << 40, 1 << 62, -1 << 62}
		p.Burst = bad[rng.Intn(len(bad))]
		if rng.Intn(2) == 0 {
			p.Limit = []int64{-5, 0, algo.MaxLimit + 1, 1 << 62}[rng.Intn(4)]
		}
	}
	return p
}

// calendarStarts are instants (UTC) next to the boundaries where calendars go wrong:
// month ends of 31, 30, 29 and 28 days, leap and century years, year ends.
func calendarStarts() []int64 {
	at := func(y int, m time.Month, d int) int64 {
		return time.Date(y, m, d, 0, 0, 0, 0, time.UTC).UnixMicro() - 3_600_000_000
	}
	return []int64{
		at(2026, 2, 1), at(2026, 3, 1), at(2028, 2, 29), at(2028, 3, 1), at(2027, 1, 1),
		at(2100, 3, 1), at(2000, 3, 1), at(2026, 5, 1), at(1970, 1, 1), at(1969, 3, 1),
		at(2026, 11, 30), at(2027, 1, 4),
	}
}

func randStep(rng *rand.Rand, w, l int64) int64 {
	w = min(max(w, algo.MinWindowUs), algo.MaxWindowUs)
	l = min(max(l, 1), algo.MaxLimit)
	switch rng.Intn(10) {
	case 0:
		return 0
	case 1:
		return -rng.Int63n(w/2 + 1) // clock stepping back (failover)
	case 2, 3:
		return rng.Int63n(3*w/l + 1)
	case 4, 5:
		return rng.Int63n(w/3 + 1)
	case 6:
		return rng.Int63n(3 * w)
	case 7:
		return rng.Int63n(1 << 40) // long idle gap
	default:
		return rng.Int63n(w/max(l, 1)*2 + 3)
	}
}

func randN(rng *rand.Rand, capa int64) int64 {
	switch rng.Intn(12) {
	case 0:
		return 0
	case 1:
		return -1 - rng.Int63n(5)
	case 2:
		return capa + 1 + rng.Int63n(capa+1)
	case 3:
		return rng.Int63n(1 << 45) // clamped amounts
	case 4, 5:
		return rng.Int63n(capa + 1)
	default:
		return 1 + rng.Int63n(min(capa, 3))
	}
}

// boundary picks a time where a rounding slip would show: a µs either side of the
// bucket being full, of cost n fitting, or of a window edge.
func boundary(rng *rand.Rand, p algo.Params, st algo.State, now, n int64) int64 {
	w := min(max(p.WindowUs, algo.MinWindowUs), algo.MaxWindowUs)
	edge := (now/w)*w + w
	if now < 0 {
		edge = -((-now)/w)*w + w
	}
	if p.Kind.CalendarPeriods() {
		// the next calendar boundary, or the one after it
		_, _, edge = algo.CalendarWindow(p, now)
		w = 0
		if rng.Intn(2) == 0 {
			_, _, edge = algo.CalendarWindow(p, edge)
		}
	}
	switch rng.Intn(4) {
	case 0:
		return algo.ResetAt(p, st, now) + rng.Int63n(3) - 1
	case 1:
		return now + algo.RetryAfter(p, st, now, n) - rng.Int63n(2)
	case 2:
		return now + algo.RetryAfter(p, st, now, 1+rng.Int63n(3)) - rng.Int63n(2)
	default:
		return edge + rng.Int63n(3) - 1 + w*rng.Int63n(2)
	}
}

// crafted returns states just inside and just outside what decoders accept.
func crafted(rng *rand.Rand, k algo.Kind, p algo.Params, now int64) []byte {
	const exact = 1 << 53
	tag := 0x10 + byte(k)
	w := min(max(p.WindowUs, algo.MinWindowUs), algo.MaxWindowUs)
	fixed := func(t int64, a, b uint32, size int) []byte {
		s := make([]byte, size)
		s[0] = tag
		binary.LittleEndian.PutUint64(s[1:], uint64(t))
		binary.LittleEndian.PutUint32(s[9:], a)
		if size == 17 {
			binary.LittleEndian.PutUint32(s[13:], b)
		}
		return s
	}
	cur := (now / w) * w
	switch k {
	case algo.Calendar:
		_, cs, ce := algo.CalendarWindow(p, now)
		_, ps, _ := algo.CalendarWindow(p, cs-1)
		_, _, ne := algo.CalendarWindow(p, ce)
		starts := []int64{cs, ps, ce, ne, cs + 1, ce - 1, cs + algo.DayUs, cs - 60_000_000, exact - 1, -exact + 1, exact}
		counts := []uint32{0, 1, 1<<32 - 1, uint32(rng.Intn(100))}
		return fixed(starts[rng.Intn(len(starts))], counts[rng.Intn(len(counts))], 0, 13)
	case algo.TokenBucket, algo.GCRA:
		ts := []int64{exact - 1, exact, -exact + 1, -exact, now + algo.MaxAheadUs, now + algo.MaxAheadUs - 1, now - 1, now + 1}
		fracs := []uint32{0, 1, 1<<32 - 1, uint32(rng.Int63n(algo.MaxLimit))}
		return fixed(ts[rng.Intn(len(ts))], fracs[rng.Intn(len(fracs))], 0, 13)
	case algo.FixedWindow, algo.SlidingWindowCounter:
		starts := []int64{cur, cur - w, cur - 2*w, cur + w, cur + 2*w, cur + 1, exact - exact%w, -exact + (exact % w)}
		size := 13
		if k == algo.SlidingWindowCounter {
			size = 17
		}
		counts := []uint32{0, 1, 1<<32 - 1, uint32(rng.Intn(100))}
		return fixed(starts[rng.Intn(len(starts))], counts[rng.Intn(len(counts))], counts[rng.Intn(len(counts))], size)
	default:
		bases := []int64{now - 1, -exact + 1, exact - 1, now + w, now + w + 1}
		counts := []uint64{0, 1, algo.MaxCount, algo.MaxCount + 1}
		base := bases[rng.Intn(len(bases))]
		s := fixed(base, 0, 0, 13)[:9]
		for range 1 + rng.Intn(3) {
			// Deltas at and beyond 2^53 (and ones landing the run next to now from a
			// base far away) are where doubles would round.
			deltas := []uint64{0, 1, exact - 1, exact, exact + 5, 1<<56 - 1, uint64(now - base), uint64(now - base - 1)}
			s = binary.AppendUvarint(s, deltas[rng.Intn(len(deltas))])
			s = binary.AppendUvarint(s, counts[rng.Intn(len(counts))])
		}
		return s
	}
}

// randState starts most sequences fresh and some from malformed, foreign or crafted
// states, which both sides must read identically.
func randState(rng *rand.Rand, k algo.Kind, p algo.Params, now int64) []byte {
	switch rng.Intn(10) {
	case 4, 5:
		return crafted(rng, k, p, now)
	case 0:
		b := make([]byte, rng.Intn(30))
		rng.Read(b)
		if len(b) > 0 && rng.Intn(2) == 0 {
			b[0] = 0x10 + byte(k)
		}
		return b
	case 1:
		other := algo.Params{Kind: algo.Kind(rng.Intn(5)), Limit: 10, WindowUs: 1_000_000}
		if k.CalendarPeriods() && rng.Intn(2) == 0 {
			// the same kind under another period or offset
			other = randCalendar(rng)
		}
		return algo.Take(other, nil, now, 7)
	case 2, 3:
		s := []byte(algo.Take(p, algo.Take(p, nil, now-5_000, 3), now, rng.Int63n(p.Capacity()+5)))
		if len(s) > 1 {
			switch rng.Intn(3) {
			case 0:
				s = s[:1+rng.Intn(len(s)-1)]
			case 1:
				s[1+rng.Intn(len(s)-1)] ^= byte(1 << rng.Intn(8))
			}
		}
		return s
	default:
		return nil
	}
}

func TestLuaMatchesGo(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	kinds := algo.Kinds()
	for _, k := range kinds {
		t.Run(k.String(), func(t *testing.T) {
			// The fragment as the service runs it: shared helpers and includes resolved.
			frag, err := store.Fragment(k)
			if err != nil {
				t.Fatalf("fragment: %v", err)
			}
			script := redis.NewScript(frag + harness)
			rng := rand.New(rand.NewSource(int64(k) + 1))
			for seq := range 60 {
				p := randParams(rng, k)
				capa := p.Capacity()
				starts := []int64{1_700_000_000_000_000 + rng.Int63n(1<<40), 0, rng.Int63n(1 << 30), -rng.Int63n(1 << 40), algo.MaxTimeUs - 1<<45}
				if k.CalendarPeriods() && rng.Intn(3) > 0 {
					starts = calendarStarts()
				}
				now := starts[rng.Intn(len(starts))]
				init := randState(rng, k, p, now)
				var steps []step
				st := algo.State(init) // Go's state while generating, to aim at boundaries
				// One sequence in four is a stream of small takes close together: many
				// log runs (merging), long debts.
				trickle := rng.Intn(4) == 0
				nsteps := 150
				if trickle {
					nsteps = 400
				}
				for range nsteps {
					op := []byte{'d', 'd', 'd', 't', 'r'}[rng.Intn(5)]
					n := randN(rng, capa)
					if trickle {
						if rng.Intn(5) > 0 {
							op, n = 't', 1+rng.Int63n(2)
						}
						now += 1 + rng.Int63n(min(max(p.WindowUs, algo.MinWindowUs), algo.MaxWindowUs)/1000+2)
					} else if rng.Intn(3) == 0 {
						now = boundary(rng, p, st, now, n)
					} else {
						now += randStep(rng, p.WindowUs, p.Limit)
					}
					now = min(max(now, -algo.MaxTimeUs+1), algo.MaxTimeUs-1)
					s := step{op: op, now: now, n: n}
					steps = append(steps, s)
					st = s.apply(p, st)
				}
				args := []any{p.Limit, p.WindowUs, p.Burst, init}
				for _, s := range steps {
					args = append(args, string(s.op), s.now, s.n)
				}
				res, err := script.Run(ctx, rdb, nil, args...).Slice()
				if err != nil {
					t.Fatalf("seq %d %+v: script: %v", seq, p, err)
				}
				if len(res) != len(steps) {
					t.Fatalf("seq %d: %d rows for %d steps", seq, len(res), len(steps))
				}
				compare(t, fmt.Sprintf("seq %d %+v init %x", seq, p, init), p, init, steps, res)
			}
		})
	}
}

func compare(t *testing.T, name string, p algo.Params, st []byte, steps []step, res []any) {
	t.Helper()
	for i, s := range steps {
		row, ok := res[i].([]any)
		if !ok {
			t.Fatalf("%s step %d: row is %T", name, i, res[i])
		}
		want := []int64{algo.Available(p, st, s.now), algo.ResetAt(p, st, s.now), algo.RetryAfter(p, st, s.now, s.n)}
		switch s.op {
		case 'd':
			r := algo.Decide(p, st, s.now, s.n)
			allowed := int64(0)
			if r.Allowed {
				allowed = 1
			}
			want = append(want, allowed, r.Remaining, r.ResetUs, r.RetryAfterUs)
			st = r.State
		case 't':
			st = algo.Take(p, st, s.now, s.n)
		default:
			st = algo.Refund(p, st, s.now, s.n)
		}
		if len(row) != len(want)+1 {
			t.Fatalf("%s step %d: %d values, want %d", name, i, len(row), len(want)+1)
		}
		for j, w := range want {
			if got, ok := row[j].(int64); !ok || got != w {
				t.Fatalf("%s step %d (%c now=%d n=%d): value %d is %v from Lua, %d from Go (row %v)", name, i, s.op, s.now, s.n, j, row[j], w, row)
			}
		}
		luaState, ok := row[len(want)].(string)
		if !ok || !bytes.Equal([]byte(luaState), st) {
			t.Fatalf("%s step %d (%c now=%d n=%d): state %x from Lua, %x from Go", name, i, s.op, s.now, s.n, row[len(want)], st)
		}
		st = []byte(luaState)
	}
}

// TestLuaMatchesGoAcrossCalendarBoundaries walks calendar windows of every period at
// offsets either side of UTC through consecutive boundaries — months of every length,
// February of leap, common and century years, year ends — spending each period and
// deciding 1 µs before, at and after each boundary, in Go and in Redis.
func TestLuaMatchesGoAcrossCalendarBoundaries(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	frag, err := store.Fragment(algo.Calendar)
	if err != nil {
		t.Fatalf("fragment: %v", err)
	}
	script := redis.NewScript(frag + harness)
	rng := rand.New(rand.NewSource(7))
	crossings := map[string]int{}
	for per := algo.Day; per <= algo.Month; per++ {
		for _, off := range []int64{0, 330, -480, algo.MaxOffsetMinutes, -algo.MaxOffsetMinutes} {
			for _, start := range calendarStarts() {
				p := algo.CalendarParams(3, per, off)
				now := start
				var st algo.State
				var steps []step
				add := func(op byte, at, n int64) {
					s := step{op: op, now: at, n: n}
					steps = append(steps, s)
					st = s.apply(p, st)
				}
				for range 14 {
					_, _, end := algo.CalendarWindow(p, now)
					for range 1 + rng.Intn(4) {
						add('d', now, 1+rng.Int63n(2))
					}
					if rng.Intn(3) == 0 {
						add('t', now, rng.Int63n(5))
					}
					refused := !algo.Decide(p, st, end-1, 1).Allowed
					add('d', end-1, 1)
					add('d', end, 1)
					if refused {
						lt := time.UnixMicro(end).In(time.FixedZone("", int(off)*60))
						crossings[per.String()+lt.Format(" Jan 2")]++
					}
					add([]byte{'d', 'r', 't'}[rng.Intn(3)], end+1, 1)
					now = end + rng.Int63n(max(end-now, 2)/2)
				}
				args := []any{p.Limit, p.WindowUs, p.Burst, ""}
				for _, s := range steps {
					args = append(args, string(s.op), s.now, s.n)
				}
				res, err := script.Run(ctx, rdb, nil, args...).Slice()
				if err != nil {
					t.Fatalf("%+v: script: %v", p, err)
				}
				compare(t, fmt.Sprintf("%s %s from %d", per, algo.FormatOffset(off), start), p, nil, steps, res)
			}
		}
	}
	// Spent periods refused 1 µs before the boundary were decided across these local
	// boundaries (at every offset), among others.
	for _, want := range []string{"month Feb 1", "month Mar 1", "month Jan 1", "day Mar 1", "day Feb 29", "week Jan 4"} {
		if crossings[want] == 0 {
			t.Errorf("no spent period crossed into %q; crossings: %v", want, crossings)
		}
	}
}

package header

import (
	"bufio"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// golden compares got with testdata/<name>.golden (or rewrites it with -update).
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if string(got) != string(want) {
		t.Errorf("%s mismatch:\n got: %s\nwant: %s", path, got, want)
	}
}

func render(h [][2]string) []byte {
	var sb strings.Builder
	for _, kv := range h {
		sb.WriteString(kv[0] + ": " + kv[1] + "\n")
	}
	return []byte(sb.String())
}

const now = 1640001600 // 2021-12-20T12:00:00Z

var searchViews = []Window{
	{Policy: "search-1m", Limit: 100, Remaining: 5, WindowSeconds: 60, ResetUnix: now + 60, ResetInSeconds: 60},
	{Policy: "search-1s", Limit: 10, Remaining: 9, WindowSeconds: 1, ResetUnix: now + 1, ResetInSeconds: 1},
}

func TestHeadersGolden(t *testing.T) {
	tenant := []Window{
		{Policy: "tenant-1h", Limit: 100000, Remaining: 41000, WindowSeconds: 3600, ResetUnix: now + 1800, ResetInSeconds: 1800},
		{Policy: "user-1m", Limit: 1000, Remaining: 0, WindowSeconds: 60, ResetUnix: now + 12, ResetInSeconds: 12},
		{Policy: "user-1s", Limit: 50, Remaining: 0, WindowSeconds: 1, ResetUnix: now + 1, ResetInSeconds: 1},
	}
	odd := []Window{{Policy: "we\"ird\\rule\té-1m", Limit: 3, Remaining: 2, WindowSeconds: 60, ResetUnix: now + 60, ResetInSeconds: 60}}
	debt := []Window{{Policy: "search-1m", Limit: 100, Remaining: -7, WindowSeconds: 60, ResetUnix: now + 65, ResetInSeconds: 65}}
	tests := []struct {
		name  string
		build func() [][2]string
	}{
		{"headers_allowed", func() [][2]string { return Append(nil, searchViews, false) }},
		{"headers_degraded", func() [][2]string { return Append(nil, searchViews, true) }},
		{"headers_refused_429", func() [][2]string {
			return AppendShadow(AppendRefused(nil, tenant, false, 13, "user"), "user-strict")
		}},
		{"headers_refused_token_bucket_caps_t", func() [][2]string {
			// Empty 100/min bucket: full in 60 s, but the next permit comes in 1 s.
			views := []Window{{Policy: "search-1m", Limit: 100, Remaining: 0, WindowSeconds: 60, ResetUnix: now + 60, ResetInSeconds: 60}}
			return AppendRefused(nil, views, false, 1, "search")
		}},
		{"headers_degraded_refused_429", func() [][2]string { return AppendRefused(nil, searchViews, true, 2, "search") }},
		{"headers_fail_closed_503", func() [][2]string { return AppendRefused(nil, nil, true, 5, "payments") }},
		{"headers_bypass", func() [][2]string { return AppendBypass(nil) }},
		{"headers_odd_rule_id", func() [][2]string {
			return AppendRule(Append(nil, odd, false), "we\"ird\\rule\té\r\n%")
		}},
		{"headers_debt_shows_zero", func() [][2]string { return Append(nil, debt, false) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.build()
			for _, kv := range h {
				for i := 0; i < len(kv[1]); i++ {
					if c := kv[1][i]; c < 0x20 || c == 0x7f {
						t.Errorf("%s value %q holds control byte %#x", kv[0], kv[1], c)
					}
				}
				if kv[0] == Policy || kv[0] == RateLimit {
					if _, err := parseSFList(kv[1]); err != nil {
						t.Errorf("%s: %q is not an sf-list: %v", kv[0], kv[1], err)
					}
				}
			}
			golden(t, tt.name, render(h))
		})
	}
}

func TestAppendNoWindows(t *testing.T) {
	if h := Append(nil, nil, false); len(h) != 0 {
		t.Errorf("Append(no windows) = %v, want nothing", h)
	}
	want := [][2]string{{XRemaining, RemainingUnknown}, {XPolicy, PolicyDegraded}}
	if h := Append(nil, nil, true); !slices.Equal(h, want) {
		t.Errorf("Append(no windows, degraded) = %v, want %v", h, want)
	}
}

// Property: on a refusal, t names the moment Retry-After names (draft section 6), and
// Retry-After is at least 1.
func TestAppendRefusedTIsRetryAfter(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for range 2_000 {
		views := make([]Window, 1+rng.IntN(4))
		for i := range views {
			views[i] = Window{Policy: "p" + strconv.Itoa(i), Limit: 100, Remaining: rng.Int64N(5) - 1,
				WindowSeconds: 60, ResetInSeconds: rng.Int64N(4000)}
		}
		retry := rng.Int64N(100) - 1
		var ra, tt int64 = -1, -1
		for _, kv := range AppendRefused(nil, views, false, retry, "p") {
			switch kv[0] {
			case RetryAfter:
				ra, _ = strconv.ParseInt(kv[1], 10, 64)
			case RateLimit:
				items, err := parseSFList(kv[1])
				if err != nil || len(items) != 1 {
					t.Fatalf("ratelimit %q: %v", kv[1], err)
				}
				v, _ := items[0].param("t")
				tt = v.i
			}
		}
		if ra < 1 || tt != ra {
			t.Fatalf("retry %d, views %+v: Retry-After %d, t %d", retry, views, ra, tt)
		}
	}
}

func TestMostRestrictive(t *testing.T) {
	tests := []struct {
		name  string
		views []Window
		want  int
	}{
		{"none", nil, -1},
		{"one", []Window{{Remaining: 3}}, 0},
		{"lowest remaining", []Window{{Remaining: 3}, {Remaining: 1}, {Remaining: 2}}, 1},
		{"debt below zero", []Window{{Remaining: 0}, {Remaining: -4}}, 1},
		{"tie: longest reset", []Window{{Remaining: 0, ResetInSeconds: 1}, {Remaining: 0, ResetInSeconds: 3600}}, 1},
		{"tie: lowest limit", []Window{{Remaining: 0, ResetInSeconds: 5, Limit: 10}, {Remaining: 0, ResetInSeconds: 5, Limit: 5}}, 1},
		{"full tie: first", []Window{{Remaining: 2, Limit: 5}, {Remaining: 2, Limit: 5}}, 0},
		// A refusal describes the window that refused, even when another one is in debt
		// or resets later (the refusing one admits last: its Retry-After is the answer's).
		{"refused first", []Window{{Remaining: -3, ResetInSeconds: 3600}, {Remaining: 0, ResetInSeconds: 5, Refused: true}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := MostRestrictive(tt.views); got != tt.want {
				t.Errorf("MostRestrictive = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestPolicyName(t *testing.T) {
	tests := []struct {
		rule     string
		windowUs int64
		want     string
	}{
		{"search", 60_000_000, "search-1m"},
		{"search", 1_000_000, "search-1s"},
		{"search", 90_000_000, "search-90s"},
		{"search", 3_600_000_000, "search-1h"},
		{"search", 86_400_000_000, "search-1d"},
		{"search", 7 * 86_400_000_000, "search-7d"},
		{"burst", 250_000, "burst-250ms"},
		{"odd", 1_500, "odd-1500us"},
		{"odd", 7, "odd-7us"},
		{"zero", 0, "zero-0s"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := PolicyName(tt.rule, tt.windowUs); got != tt.want {
				t.Errorf("PolicyName(%q, %d) = %q, want %q", tt.rule, tt.windowUs, got, tt.want)
			}
		})
	}
}

func TestWindowSeconds(t *testing.T) {
	tests := []struct{ us, want int64 }{
		{0, 1}, {1, 1}, {500_000, 1}, {1_000_000, 1}, {1_000_001, 2}, {1_500_000, 2}, {60_000_000, 60}, {86_400_000_000, 86400},
	}
	for _, tt := range tests {
		t.Run(strconv.FormatInt(tt.us, 10), func(t *testing.T) {
			if got := WindowSeconds(tt.us); got != tt.want {
				t.Errorf("WindowSeconds(%d) = %d, want %d", tt.us, got, tt.want)
			}
		})
	}
}

func TestFieldValue(t *testing.T) {
	tests := []struct{ in, want string }{
		{"search", "search"},
		{"tenant.users_v2-x", "tenant.users_v2-x"},
		{"", ""},
		{"a b", "a%20b"},
		{"inject\r\nx-admin: 1", "inject%0D%0Ax-admin:%201"},
		{"50%", "50%25"},
		{"é", "%C3%A9"},
		{"\x00\x7f", "%00%7F"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := FieldValue(tt.in); got != tt.want {
				t.Errorf("FieldValue(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// TestDraftExamples rebuilds windows from each example quoted from the draft and
// requires Append (and AppendRetryAfter) to produce the quoted fields back.
func TestDraftExamples(t *testing.T) {
	f, err := os.Open(filepath.Join("testdata", "draft-10-examples.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type example struct {
		name   string
		fields [][2]string
	}
	var examples []example
	cur := example{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			cur = example{name: strings.TrimPrefix(line, "## ")}
		case line == "":
			if len(cur.fields) > 0 {
				examples = append(examples, cur)
			}
			cur = example{}
		case strings.HasPrefix(line, "#"):
		default:
			name, value, ok := strings.Cut(line, ":")
			if !ok {
				t.Fatalf("bad line %q", line)
			}
			cur.fields = append(cur.fields, [2]string{strings.ToLower(name), strings.TrimSpace(value)})
		}
	}
	if len(cur.fields) > 0 {
		examples = append(examples, cur)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(examples) < 20 {
		t.Fatalf("read only %d examples", len(examples))
	}
	checked := 0
	for _, ex := range examples {
		t.Run(ex.name, func(t *testing.T) {
			var views []Window
			index := map[string]int{}
			var policyItems, limitItems []sfItem
			retryAfter := int64(-1)
			for _, kv := range ex.fields {
				switch kv[0] {
				case Policy, RateLimit:
					items, err := parseSFList(kv[1])
					if err != nil {
						t.Fatalf("draft field %q does not parse: %v", kv[1], err)
					}
					if kv[0] == Policy {
						policyItems = append(policyItems, items...)
					} else {
						limitItems = append(limitItems, items...)
					}
				case RetryAfter:
					n, err := strconv.ParseInt(kv[1], 10, 64)
					if err != nil {
						t.Skip("HTTP-date Retry-After: Tollgate sends delay-seconds")
					}
					retryAfter = n
				}
			}
			for _, it := range append(append([]sfItem{}, policyItems...), limitItems...) {
				if it.value.kind != 's' {
					t.Skip("token policy name: Tollgate always sends sf-strings")
				}
				for _, p := range it.params {
					if !strings.Contains("q w r t", p.key) || len(p.key) != 1 {
						t.Skipf("parameter %q: Tollgate does not send it", p.key)
					}
				}
			}
			for _, it := range policyItems {
				q, _ := it.param("q")
				w, ok := it.param("w")
				if !ok {
					t.Skip("policy without w: Tollgate always knows its window")
				}
				index[it.value.s] = len(views)
				// Without a RateLimit item the policy is not the restrictive one.
				views = append(views, Window{Policy: it.value.s, Limit: q.i, Remaining: q.i, WindowSeconds: w.i,
					ResetInSeconds: w.i})
			}
			if len(limitItems) > 1 {
				t.Fatalf("example has %d RateLimit items; Tollgate sends one", len(limitItems))
			}
			for _, it := range limitItems {
				r, ok := it.param("r")
				if !ok {
					t.Skip("RateLimit without r: Tollgate always knows what is left")
				}
				tt, _ := it.param("t")
				i, ok := index[it.value.s]
				if !ok {
					i = len(views)
					views = append(views, Window{Policy: it.value.s, Limit: r.i, WindowSeconds: 1})
				}
				views[i].Remaining, views[i].ResetInSeconds = r.i, tt.i
			}
			got := Append(nil, views, false)
			if retryAfter >= 0 {
				got = AppendRetryAfter(got, retryAfter)
			}
			have := map[string]string{}
			for _, kv := range got {
				have[kv[0]] = kv[1]
			}
			want := map[string]string{}
			if len(policyItems) > 0 {
				want[Policy] = serializeList(policyItems)
			}
			if len(limitItems) > 0 {
				want[RateLimit] = serializeList(limitItems)
			}
			if retryAfter >= 0 {
				want[RetryAfter] = strconv.FormatInt(retryAfter, 10)
			}
			for name, w := range want {
				if have[name] != w {
					t.Errorf("%s = %q, want %q (the draft's, canonical form)", name, have[name], w)
				}
			}
			checked++
		})
	}
	if checked < 15 {
		t.Errorf("only %d draft examples checked", checked)
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	tests := []struct {
		name              string
		retryUs, jitterUs int64
		rnd               uint64
		want              int64
	}{
		{"zero is at least 1", 0, 0, 0, 1},
		{"negative is at least 1", -5_000_000, 0, 0, 1},
		{"one microsecond rounds up", 1, 0, 0, 1},
		{"exact second", 1_000_000, 0, 0, 1},
		{"just over a second", 1_000_001, 0, 0, 2},
		{"36 s", 35_200_000, 0, 0, 36},
		{"no jitter with rnd 0", 35_200_000, 1_000_000, 0, 36},
		{"full jitter with max rnd", 35_200_000, 1_000_000, math.MaxUint64, 37},
		{"half jitter", 35_000_000, 1_000_000, 1 << 63, 36},
		{"max jitter lands exactly on the bound", 35_500_000, 1_500_000, math.MaxUint64, 37},
		{"jitter of one microsecond", 2_000_000, 1, math.MaxUint64, 3},
		{"negative jitter bound ignored", 2_000_000, -1, math.MaxUint64, 2},
		{"overflow saturates", math.MaxInt64, math.MaxInt64, math.MaxUint64, math.MaxInt64/1_000_000 + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RetryAfterSeconds(tt.retryUs, tt.jitterUs, tt.rnd); got != tt.want {
				t.Errorf("RetryAfterSeconds(%d, %d, %d) = %d, want %d", tt.retryUs, tt.jitterUs, tt.rnd, got, tt.want)
			}
		})
	}
}

func ceilSec(us int64) int64 { return max((us+999_999)/1_000_000, 1) }

// Property: never below ceil(retry) (a client that obeys is admitted), never above
// ceil(retry + jitterMax).
func TestRetryAfterBounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200_000 {
		retry := rng.Int64N(600_000_000) - 1_000_000
		jitter := rng.Int64N(5_000_000)
		got := RetryAfterSeconds(retry, jitter, rng.Uint64())
		lo, hi := ceilSec(max(retry, 0)), ceilSec(max(retry, 0)+jitter)
		if got < lo || got > hi {
			t.Fatalf("RetryAfterSeconds(%d, %d) = %d, want within [%d, %d]", retry, jitter, got, lo, hi)
		}
	}
}

// The jitter spreads clients: with retry 0 and jitter up to 10 s, each whole second of
// the ten gets about a tenth of them (deterministic seed, so this cannot flake).
func TestRetryAfterJitterUniform(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const n = 100_000
	var counts [11]int
	for range n {
		counts[RetryAfterSeconds(0, 10_000_000, rng.Uint64())]++
	}
	if counts[0] != 0 {
		t.Errorf("%d answers of 0 seconds", counts[0])
	}
	for s := 1; s <= 10; s++ {
		if counts[s] < n/10*9/10 || counts[s] > n/10*11/10 {
			t.Errorf("second %d got %d of %d answers, want about %d", s, counts[s], n, n/10)
		}
	}
}

// What runs per request must not allocate: a Builder reused across requests formats
// every header, fixed parts precomputed or not, into buffers it keeps.
func TestAllocations(t *testing.T) {
	dst := make([][2]string, 0, 16)
	fixed := append([]Window(nil), searchViews...)
	for i := range fixed {
		fixed[i].Fixed = NewFixed(fixed[i].Policy, fixed[i].Limit, fixed[i].WindowSeconds)
	}
	var b Builder
	build := func() {
		b.Reset()
		b.Limits(searchViews, false)
		b.Limits(fixed, true)
		b.Refused(fixed[:1], false, 30, "search")
		b.Rule(XShadow, "odd id")
		b.Bypass()
		_ = b.Pairs()
	}
	build()
	if n := testing.AllocsPerRun(100, build); n != 0 {
		t.Errorf("Builder: %v allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = RetryAfterSeconds(1_500_000, 1_000_000, 42) }); n != 0 {
		t.Errorf("RetryAfterSeconds: %v allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { dst = AppendRule(dst[:0], "search") }); n != 0 {
		t.Errorf("AppendRule: %v allocations, want 0", n)
	}
}

func BenchmarkAppend(b *testing.B) {
	b.ReportAllocs()
	dst := make([][2]string, 0, 16)
	for b.Loop() {
		dst = Append(dst[:0], searchViews, false)
	}
}

// A Builder says exactly what Append and AppendRefused say, with the fixed parts
// precomputed (NewFixed) or formatted per request, and nothing survives a Reset.
func TestBuilderMatchesAppend(t *testing.T) {
	withFixed := func(views []Window) []Window {
		out := append([]Window(nil), views...)
		for i := range out {
			out[i].Fixed = NewFixed(out[i].Policy, out[i].Limit, out[i].WindowSeconds)
		}
		return out
	}
	odd := []Window{{Policy: "we\"ird%id-1s", Limit: 5, Remaining: 2, WindowSeconds: 1, ResetUnix: now + 1, ResetInSeconds: 1}}
	cases := []struct {
		name  string
		views []Window
	}{
		{"none", nil},
		{"one", searchViews[:1]},
		{"several", searchViews},
		{"odd policy", odd},
	}
	var b Builder
	for _, c := range cases {
		for _, degraded := range []bool{false, true} {
			for _, fixed := range []bool{false, true} {
				views := c.views
				if fixed {
					views = withFixed(views)
				}
				name := fmt.Sprintf("%s/degraded=%v/fixed=%v", c.name, degraded, fixed)
				b.Reset()
				b.Limits(views, degraded)
				if got, want := fmt.Sprint(b.Pairs()), fmt.Sprint(Append(nil, c.views, degraded)); got != want {
					t.Errorf("%s: Limits %s, Append %s", name, got, want)
				}
				b.Reset()
				b.Refused(views, degraded, 7, "r%1")
				if got, want := fmt.Sprint(b.Pairs()), fmt.Sprint(AppendRefused(nil, c.views, degraded, 7, "r%1")); got != want {
					t.Errorf("%s: Refused %s, AppendRefused %s", name, got, want)
				}
			}
		}
	}
}

// One Builder reused answer after answer, as a filter worker reuses it, says what a
// fresh one says (Append): nothing of an answer carries into the next, whether the
// windows, their reset times and remaining counts repeat or change.
func TestBuilderMatchesAppendInTurns(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	resets := []int64{now, now + 1, now + 59, now + 3600, 0, 9_999_999_999}
	var b Builder
	for i := 0; i < 500; i++ {
		views := make([]Window, 1+rng.IntN(3))
		for k := range views {
			views[k] = Window{Policy: "p" + strconv.Itoa(k), Limit: 1 + rng.Int64N(1000), WindowSeconds: 1 + rng.Int64N(60),
				ResetUnix: resets[rng.IntN(len(resets))], ResetInSeconds: rng.Int64N(100)}
			views[k].Remaining = rng.Int64N(views[k].Limit+2) - 1
		}
		degraded := rng.IntN(5) == 0
		b.Reset()
		b.Limits(views, degraded)
		if got, want := fmt.Sprint(b.Pairs()), fmt.Sprint(Append(nil, views, degraded)); got != want {
			t.Fatalf("answer %d: Limits %s, Append %s", i, got, want)
		}
	}
}

// A burst above the limit is advertised as the capacity over its refill time (never a
// faster rate than enforced); at or below the limit the limit per window is.
func TestQuota(t *testing.T) {
	for _, tt := range []struct {
		name                      string
		limit, capacity, windowUs int64
		q, w                      int64
	}{
		{"no burst", 100, 100, 60_000_000, 100, 60},
		{"burst below the limit", 10, 2, 1_000_000, 10, 1},
		{"burst above the limit", 100, 120, 60_000_000, 120, 72},
		{"refill rounded up", 3, 4, 1_000_000, 4, 2},
		{"one per minute, burst 50", 1, 50, 60_000_000, 50, 3000},
		{"sub-second window", 10, 20, 100_000, 20, 1},
		{"saturated", 1, 1_000_000_000, 1 << 62, 1_000_000_000, 9_223_372_036_855},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if q, w := Quota(tt.limit, tt.capacity, tt.windowUs); q != tt.q || w != tt.w {
				t.Errorf("Quota(%d, %d, %d) = q %d, w %d; want q %d, w %d", tt.limit, tt.capacity, tt.windowUs, q, w, tt.q, tt.w)
			}
		})
	}
}

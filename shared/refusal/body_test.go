package refusal

import (
	"encoding/json"
	"flag"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
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

const now = 1640001600 // 2021-12-20T12:00:00Z

func TestBodiesGolden(t *testing.T) {
	tests := []struct {
		name string
		body []byte
	}{
		{"body_429", Body429(&Exceeded{Limit: 100, WindowSeconds: 60, RetryAfterSeconds: 36, ResetUnix: now + 60, Rule: "search"})},
		{"body_429_penalty", Body429(&Exceeded{Limit: 100, WindowSeconds: 60, RetryAfterSeconds: 120, ResetUnix: now + 60,
			Rule: "search", PenaltyLevel: 2, PenaltySeconds: 120})},
		{"body_429_one_request_per_second", Body429(&Exceeded{Limit: 1, WindowSeconds: 1, RetryAfterSeconds: 1, ResetUnix: now + 1, Rule: "slow"})},
		{"body_429_odd_rule_id", Body429(&Exceeded{Limit: 5, WindowSeconds: 10, RetryAfterSeconds: 3, ResetUnix: now,
			Rule: "a\"b\\c\n\x01\u2028é\xff"})},
		{"body_403_key", Body403("sk_revoked_*", false)},
		{"body_403_address", Body403("203.0.113.0/24", true)},
		{"body_503", Body503(5, "payments")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var v map[string]any
			if err := json.Unmarshal(tt.body, &v); err != nil {
				t.Fatalf("body is not JSON: %v\n%s", err, tt.body)
			}
			golden(t, tt.name, append(tt.body, '\n'))
		})
	}
}

// The 429 body is the documented one (README.md, plus the rule id).
func TestBody429Literal(t *testing.T) {
	got := string(Body429(&Exceeded{Limit: 100, WindowSeconds: 60, RetryAfterSeconds: 36, ResetUnix: now + 60, Rule: "search"}))
	want := `{"error":{"code":"RATE_LIMIT_EXCEEDED","message":"Rate limit of 100 requests per 60 seconds exceeded",` +
		`"details":{"limit":100,"window_seconds":60,"retry_after_seconds":36,"reset_at":"2021-12-20T12:01:00Z","rule":"search"}}}`
	if got != want {
		t.Errorf("Body429:\n got %s\nwant %s", got, want)
	}
	var v struct {
		Error struct {
			Details struct {
				Rule         string `json:"rule"`
				PenaltyLevel *int   `json:"penalty_level"`
			} `json:"details"`
		} `json:"error"`
	}
	pen := Body429(&Exceeded{Rule: "x\"y", PenaltyLevel: 1, PenaltySeconds: 30})
	if err := json.Unmarshal(pen, &v); err != nil {
		t.Fatal(err)
	}
	if v.Error.Details.Rule != "x\"y" || v.Error.Details.PenaltyLevel == nil || *v.Error.Details.PenaltyLevel != 1 {
		t.Errorf("penalty body decoded to %+v", v)
	}
}

func TestAppendRFC3339(t *testing.T) {
	tests := []struct {
		sec  int64
		want string
	}{
		{0, "1970-01-01T00:00:00Z"},
		{-1, "1970-01-01T00:00:00Z"},
		{now + 60, "2021-12-20T12:01:00Z"},
		{951782400, "2000-02-29T00:00:00Z"},
		{4107542400, "2100-03-01T00:00:00Z"},
		{253402300799, "9999-12-31T23:59:59Z"},
		{math.MaxInt64, "9999-12-31T23:59:59Z"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := string(AppendRFC3339(nil, tt.sec)); got != tt.want {
				t.Errorf("AppendRFC3339(%d) = %q, want %q", tt.sec, got, tt.want)
			}
		})
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 100_000 {
		sec := rng.Int64N(253402300800)
		want := time.Unix(sec, 0).UTC().Format(time.RFC3339)
		if got := string(AppendRFC3339(nil, sec)); got != want {
			t.Fatalf("AppendRFC3339(%d) = %q, time.Format says %q", sec, got, want)
		}
	}
}

func TestJSONString(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", `""`},
		{"search", `"search"`},
		{`a"b\c`, `"a\"b\\c"`},
		{"\n\r\t\x00\x1f", `"\n\r\t\u0000\u001f"`},
		{"é日本", `"é日本"`},
		{"\xff", `"\ufffd"`},
		{"a\xc3", `"a\ufffd"`},
		{"\u2028\u2029", `"\u2028\u2029"`},
		{"</script>", `"</script>"`},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := string(appendJSONString(nil, tt.in)); got != tt.want {
				t.Errorf("appendJSONString(%q) = %s, want %s", tt.in, got, tt.want)
			}
		})
	}
}

// A body is formatted per refused request: it must not allocate.
func TestAllocations(t *testing.T) {
	body := make([]byte, 0, 512)
	e := &Exceeded{Limit: 100, WindowSeconds: 60, RetryAfterSeconds: 36, ResetUnix: now, Rule: "search", PenaltyLevel: 1}
	if n := testing.AllocsPerRun(100, func() { body = AppendBody429(body[:0], e) }); n != 0 {
		t.Errorf("AppendBody429: %v allocations, want 0", n)
	}
}

func BenchmarkBody429(b *testing.B) {
	b.ReportAllocs()
	e := &Exceeded{Limit: 100, WindowSeconds: 60, RetryAfterSeconds: 36, ResetUnix: now, Rule: "search"}
	body := make([]byte, 0, 512)
	for b.Loop() {
		body = AppendBody429(body[:0], e)
	}
}

package rule

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// TestParseReportsEveryError: one run names each mistake of a rule file, in the order
// Parse checks the document, not only the first.
func TestParseReportsEveryError(t *testing.T) {
	_, err := Parse(readFixture(t, "several_errors.json"))
	var got []string
	for _, fe := range All(err) {
		got = append(got, fe.Field)
	}
	want := []string{"deny[0]", "rules[1].windows[0].limit", "rules[1].windows[1].window", "rules[2].fail"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("fields %q, want %q (error: %v)", got, want, err)
	}
	for _, f := range want {
		if !strings.Contains(err.Error(), f+": ") {
			t.Errorf("error text %q does not name %s", err, f)
		}
	}
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "deny[0]" {
		t.Errorf("errors.As finds %v, want the first error", fe)
	}
}

// TestParseErrorsBounded: a document with more mistakes than MaxErrors gets MaxErrors
// of them and says there were more.
func TestParseErrorsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"rules":[`)
	for i := 0; i < 3*MaxErrors; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"id":"r` + strconv.Itoa(i) + `","limit":0,"window":"1s"}`)
	}
	b.WriteString(`]}`)
	_, err := Parse([]byte(b.String()))
	var es *Errors
	if !errors.As(err, &es) {
		t.Fatalf("error %v is not *Errors", err)
	}
	if len(es.List) != MaxErrors || !es.Truncated || !strings.HasSuffix(err.Error(), "(more errors not shown)") {
		t.Fatalf("%d errors, truncated %v: %v", len(es.List), es.Truncated, err)
	}
	if es.List[MaxErrors-1].Field != "rules["+strconv.Itoa(MaxErrors-1)+"].limit" {
		t.Errorf("last error %v", es.List[MaxErrors-1])
	}
}

// TestSyntaxErrorOffset: a document that is not JSON is refused with the byte offset,
// line and column of its first mistake.
func TestSyntaxErrorOffset(t *testing.T) {
	tests := []struct {
		name   string
		doc    string
		offset int
		msg    string
	}{
		{"empty", ``, 0, "line 1, column 1 (byte 0): unexpected end of input, want a value"},
		{"truncated", `{"rules": [`, 11, "unexpected end of input, want a value"},
		{"trailing comma", `{"rules": [1,]}`, 13, `unexpected ']', want a value`},
		{"missing colon", `{"rules" []}`, 9, `unexpected '[', want ':'`},
		{"second line", "{\n  \"version\": 1,\n  \"rules\": [}\n}", 30, `line 3, column 13 (byte 30): unexpected '}', want a value`},
		{"bare word", `{"fail": open}`, 9, `unexpected 'o', want a value`},
		{"bad literal", `{"shadow": tru}`, 14, `unexpected '}', want "true"`},
		{"control character", "{\"id\": \"a\tb\"}", 9, "control character in a string"},
		{"bad escape", `{"id": "a\qb"}`, 10, `unexpected 'q', want an escape`},
		{"short unicode escape", `{"id": "\u12"}`, 12, `want a hex digit of a \u escape`},
		{"unterminated string", `{"id": "abc`, 11, `unexpected end of input, want '"' closing the string`},
		{"leading zero", `{"version": 01}`, 13, `unexpected '1', want ',' or '}'`},
		{"fraction without digits", `{"version": 1.}`, 14, `unexpected '}', want a digit`},
		{"two documents", `{} {}`, 3, `unexpected '{', want the end of the document`},
		{"field name not a string", `{rules: []}`, 1, `unexpected 'r', want a field name`},
		{"too deep", strings.Repeat("[", maxNesting+1), maxNesting, "nested deeper than 64 levels"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc))
			var fe *FieldError
			if !errors.As(err, &fe) || !fe.Syntax {
				t.Fatalf("error %v is not a syntax error", err)
			}
			if fe.Offset != tt.offset || fe.Field != "" || !strings.Contains(fe.Msg, tt.msg) {
				t.Errorf("error %q at offset %d, want offset %d and %q", err, fe.Offset, tt.offset, tt.msg)
			}
			if !strings.HasPrefix(err.Error(), "configuration: invalid JSON at line ") {
				t.Errorf("error %q does not say where", err)
			}
		})
	}
}

func TestParseDuration(t *testing.T) {
	const (
		ms  = int64(1e6)
		sec = 1000 * ms
		h   = 3600 * sec
		d   = 24 * h
	)
	tests := []struct {
		in string
		ns int64
		ok bool
	}{
		{"30d", 30 * d, true},
		{"31d", 31 * d, true},
		{"1d12h", d + 12*h, true},
		{"1.5h", 90 * 60 * sec, true},
		{"1m30s", 90 * sec, true},
		{"500ms", 500 * ms, true},
		{"1500us", 1500_000, true},
		{"2µs", 2000, true},
		{"7ns", 7, true},
		{"-1s", -sec, true},
		{"+2s", 2 * sec, true},
		{"0", 0, true},
		{"0.5d", 12 * h, true},
		{"99999999999999999999d", 1<<63 - 1, true},
		{"200000d", 1<<63 - 1, true},
		{"", 0, false},
		{"1", 0, false},
		{"d", 0, false},
		{"1x", 0, false},
		{"1dd", 0, false},
		{".d", 0, false},
		{"1 d", 0, false},
		{"-", 0, false},
	}
	for _, tt := range tests {
		ns, ok := parseDuration(tt.in)
		if ns != tt.ns || ok != tt.ok {
			t.Errorf("parseDuration(%q) = %d, %v; want %d, %v", tt.in, ns, ok, tt.ns, tt.ok)
		}
	}
}

func TestFormatUs(t *testing.T) {
	tests := map[int64]string{
		0: "0s", 1000: "1ms", 1500: "1500us", 86_400_000_000: "1d", 31 * 86_400_000_000: "31d",
		129_600_000_000: "1d12h", 90_000_000: "1m30s", 1_001_000: "1s1ms", -2_000_000: "-2s",
	}
	for us, want := range tests {
		if got := formatUs(us); got != want {
			t.Errorf("formatUs(%d) = %q, want %q", us, got, want)
		}
		if ns, ok := parseDuration(want); us%1000 == 0 && (!ok || ns != us*1000) {
			t.Errorf("parseDuration(formatUs(%d)) = %d, %v", us, ns, ok)
		}
	}
}

// TestWindowReportsEveryError: every mistake of one window is reported, each naming its
// field, in the order limit, window (or calendar), burst, wherever a window is written
// (a rule's shorthand, a windows entry, a tier, an override); a check between fields
// (algo.Params.Validate) is reported once the fields it relates are valid.
func TestWindowReportsEveryError(t *testing.T) {
	type want = wantError
	tests := []struct {
		name string
		doc  string
		want []want
	}{
		{"shorthand: limit, window and burst", `{"rules":[{"id":"r","limit":0,"window":"1 minute","burst":-1}]}`, []want{
			{"rules[0].limit", "must be > 0, got 0"},
			{"rules[0].window", `invalid duration "1 minute"`},
			{"rules[0].burst", "must be >= 0, got -1"},
		}},
		{"shorthand: limit and window missing", `{"rules":[{"id":"r"}]}`, []want{
			{"rules[0].limit", `required (or "windows")`},
			{"rules[0].window", `required (or "windows")`},
		}},
		{"windows entry: every field of a fixed window", `{"rules":[{"id":"r","algorithm":"fixed_window","windows":[{"limit":-5,"window":"32d","burst":5}]}]}`, []want{
			{"rules[0].windows[0].limit", "must be > 0, got -5"},
			{"rules[0].windows[0].window", "must be <= 31d"},
			{"rules[0].windows[0].burst", "only token_bucket and gcra use burst"},
		}},
		{"windows entry: unknown field, then the rest", `{"rules":[{"id":"r","windows":[{"limit":1,"window":"1s"},{"limt":5,"window":"1s","burst":"x"}]}]}`, []want{
			{"rules[0].windows[1].limt", "unknown field"},
			{"rules[0].windows[1].limit", "required"},
			{"rules[0].windows[1].burst", `must be an integer, got "x"`},
		}},
		{"cross-field check with a bad burst", `{"rules":[{"id":"r","limit":1001,"window":1,"burst":-1}]}`, []want{
			{"rules[0].limit", "more than one permit per µs"},
			{"rules[0].burst", "must be >= 0, got -1"},
		}},
		{"cross-field check waits for valid fields", `{"rules":[{"id":"r","limit":1001,"window":"1 ms"}]}`, []want{
			{"rules[0].window", `invalid duration "1 ms"`},
		}},
		{"calendar: algorithm, window, period, offset, burst", `{"rules":[{"id":"r","limit":10,"window":"1d","burst":3,"calendar":{"period":"year","utc_offset":"+5:30"}}]}`, []want{
			{"rules[0].calendar", `needs "algorithm": "fixed_window", the rule's algorithm is token_bucket`},
			{"rules[0].window", `cannot be combined with "calendar"`},
			{"rules[0].calendar.period", `got "year"`},
			{"rules[0].calendar.utc_offset", `got "+5:30"`},
			{"rules[0].burst", "only token_bucket and gcra use burst"},
		}},
		{"tier", `{"tiers":[{"name":"pro","keys":["p_*"]}],"rules":[{"id":"r","limit":1,"window":"1s","tiers":{"pro":{"limit":0,"window":"soon","windw":1}}}]}`, []want{
			{"rules[0].tiers.pro.windw", "unknown field"},
			{"rules[0].tiers.pro.limit", "must be > 0, got 0"},
			{"rules[0].tiers.pro.window", `invalid duration "soon"`},
		}},
		{"override", `{"rules":[{"id":"r","limit":1,"window":"1s","overrides":[{"limit":0,"windw":"1s"}]}]}`, []want{
			{"rules[0].overrides[0].windw", "unknown field"},
			{"rules[0].overrides[0].key", "required"},
			{"rules[0].overrides[0].limit", "must be > 0, got 0"},
			{"rules[0].overrides[0].window", "required"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErrors(t, tt.doc, tt.want)
		})
	}
}

type wantError struct{ field, msg string }

// checkErrors asserts Parse refuses doc with exactly the errors want, in order, each
// naming its field first.
func checkErrors(t *testing.T, doc string, want []wantError) {
	t.Helper()
	_, err := Parse([]byte(doc))
	got := All(err)
	if len(got) != len(want) {
		t.Fatalf("%d errors, want %d: %v", len(got), len(want), err)
	}
	for i, w := range want {
		if got[i].Field != w.field || !strings.Contains(got[i].Msg, w.msg) {
			t.Errorf("error %d: %v, want %s: ...%s...", i, got[i], w.field, w.msg)
		}
		if !strings.HasPrefix(got[i].Error(), w.field+": ") {
			t.Errorf("error %q does not start with its field", got[i])
		}
	}
}

// TestSyncReportsEveryError: the sync block's fields are independent, so each mistake
// among them is reported; the checks between fields run once every number is valid.
func TestSyncReportsEveryError(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []wantError
	}{
		{"every field", `{"sync":{"cluster":"a b","interval_ms":5,"timeout_ms":"1s","table_slots":10}}`, []wantError{
			{"sync.cluster", "must be"},
			{"sync.interval_ms", "must be >= 10, got 5"},
			{"sync.timeout_ms", `must be an integer, got "1s"`},
			{"sync.table_slots", "must be >= 64, got 10"},
		}},
		{"checks between fields", `{"sync":{"interval_ms":500,"lease_ttl_ms":200,"stale_ms":100}}`, []wantError{
			{"sync.lease_ttl_ms", "must be >= sync.interval_ms (500), got 200"},
			{"sync.stale_ms", "must be >= sync.interval_ms (500), got 100"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErrors(t, tt.doc, tt.want)
		})
	}
}

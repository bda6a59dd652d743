package pretty

import (
	"bytes"
	"encoding/json"
	"testing"
)

// unquote decodes every literal as encoding/json does, which upstream called here.
func TestUnquoteMatchesEncodingJSON(t *testing.T) {
	for _, lit := range []string{
		`""`, `"plain"`, `"a\"b"`, `"\\\/\b\f\n\r\t"`, `"caf\u00e9"`, `"\u00E9\u4e2d"`,
		`"\ud83d\ude00"`, `"\ud83d"`, `"\ude00x"`, `"\ud83d\u0041"`, `"\ud83dx\ude00"`,
		`"\ud83d\u12"`, `"\u12"`, `"\x"`, `"\"`, `"a` + "\x01" + `b"`, `"tab` + "\t" + `"`,
		"\"\xff\xfe\"", "\"caf\xc3\xa9\"", "\"\xed\xa0\x80\"", `"unterminated`, `x"`, `"`,
		`"a"b"`, `"\u0000"`, "\"\x7f\"",
	} {
		var want string
		wantOK := json.Unmarshal([]byte(lit), &want) == nil
		got := unquote([]byte(lit))
		if (got != nil) != wantOK {
			t.Errorf("unquote(%q) = %q, encoding/json ok=%v %q", lit, got, wantOK, want)
			continue
		}
		if wantOK && !bytes.Equal(got, []byte(want)) {
			t.Errorf("unquote(%q) = %q, want %q", lit, got, want)
		}
	}
}

// Sorting keys with escapes orders them by their decoded text, as upstream.
func TestSortKeysDecodesEscapes(t *testing.T) {
	got := PrettyOptions([]byte(`{"\u0063\"":3,"\u0062":1,"a":2}`), &Options{SortKeys: true, Indent: " "})
	want := "{\n \"a\": 2,\n \"\\u0062\": 1,\n \"\\u0063\\\"\": 3\n}\n"
	if string(got) != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

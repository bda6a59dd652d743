package refusal

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzJSONString: the escaper always yields a JSON string that decodes to the input
// (with each invalid UTF-8 byte replaced by U+FFFD).
func FuzzJSONString(f *testing.F) {
	for _, s := range []string{"", "search", `a"b\c`, "\n\r\t\x00", "é日本", "\xff\xfe", "a\xc3", "\u2028", "%41", " lead", "trail "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		enc := appendJSONString(nil, s)
		if !json.Valid(enc) {
			t.Fatalf("invalid JSON for %q: %s", s, enc)
		}
		var got string
		if err := json.Unmarshal(enc, &got); err != nil {
			t.Fatal(err)
		}
		var want strings.Builder
		for _, r := range s { // range yields U+FFFD per invalid byte
			want.WriteRune(r)
		}
		if got != want.String() {
			t.Fatalf("round trip of %q: got %q, want %q", s, got, want.String())
		}
	})
}

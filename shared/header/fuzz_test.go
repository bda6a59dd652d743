package header

import (
	"strconv"
	"strings"
	"testing"
)

var escaperSeeds = []string{"", "search", `a"b\c`, "\n\r\t\x00", "é日本", "\xff\xfe", "a\xc3", "\u2028", "%41", " lead", "trail "}

// FuzzSFString: policy names always serialize to a valid sf-string that parses and
// percent-decodes back to the name; printable names without '%' pass through as is.
func FuzzSFString(f *testing.F) {
	for _, s := range escaperSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		enc := string(appendSFString(nil, s))
		items, err := parseSFList(enc + ";q=1")
		if err != nil || len(items) != 1 || items[0].value.kind != 's' {
			t.Fatalf("%q serialized to %q, not an sf-string item: %v", s, enc, err)
		}
		got, ok := percentDecode(items[0].value.s)
		if !ok || got != s {
			t.Fatalf("%q serialized to %q decodes back to %q (ok %v)", s, enc, got, ok)
		}
		plain := !strings.Contains(s, "%")
		for i := 0; i < len(s); i++ {
			plain = plain && s[i] >= 0x20 && s[i] <= 0x7e
		}
		if plain && items[0].value.s != s {
			t.Fatalf("printable %q was escaped: %q", s, enc)
		}
	})
}

func percentDecode(v string) (string, bool) {
	var dec strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] != '%' {
			dec.WriteByte(v[i])
			continue
		}
		if i+2 >= len(v) {
			return "", false
		}
		n, err := strconv.ParseUint(v[i+1:i+3], 16, 8)
		if err != nil {
			return "", false
		}
		dec.WriteByte(byte(n))
		i += 2
	}
	return dec.String(), true
}

// FuzzFieldValue: the header-safe form is visible ASCII only and percent-decodes back.
func FuzzFieldValue(f *testing.F) {
	for _, s := range escaperSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v := FieldValue(s)
		for i := 0; i < len(v); i++ {
			if c := v[i]; c <= ' ' || c >= 0x7f {
				t.Fatalf("FieldValue(%q) = %q holds byte %#x", s, v, c)
			}
		}
		if dec, ok := percentDecode(v); !ok || dec != s {
			t.Fatalf("FieldValue(%q) = %q decodes to %q (ok %v)", s, v, dec, ok)
		}
	})
}

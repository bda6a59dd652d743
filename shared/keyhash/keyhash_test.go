package keyhash

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strings"
	"testing"
)

func TestKeyHash(t *testing.T) {
	tests := []struct{ name, key string }{
		{"empty", ""},
		{"api key", "sk_live_abuser"},
		{"longer than a block", "a-caller-key-that-is-longer-than-one-sha256-block-of-sixty-four-bytes-0123456789"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sum := sha256.Sum256([]byte(tt.key))
			want := hex.EncodeToString(sum[:8])
			if got := String(tt.key); got != want {
				t.Fatalf("String(%q) = %q, want %q", tt.key, got, want)
			}
			if got := string(Append([]byte("key="), tt.key)); got != "key="+want {
				t.Fatalf("Append = %q", got)
			}
		})
	}
}

func TestAppendAllocatesNothing(t *testing.T) {
	buf := make([]byte, 0, 64)
	key := "sk_live_abuser"
	if n := testing.AllocsPerRun(100, func() { buf = Append(buf[:0], key) }); n != 0 {
		t.Fatalf("Append allocates %.0f times per call", n)
	}
}

// TestSum256 checks the package's SHA-256 against crypto/sha256 at every length over
// three blocks (each padding case: room for the length, none, exactly none).
func TestSum256(t *testing.T) {
	buf := make([]byte, 200)
	for i := range buf {
		buf[i] = byte(i*7 + 3)
	}
	for n := 0; n <= len(buf); n++ {
		if got, want := sum256(string(buf[:n])), sha256.Sum256(buf[:n]); got != want {
			t.Fatalf("length %d: %x, want %x", n, got, want)
		}
	}
}

func FuzzSum256(f *testing.F) {
	f.Add("")
	f.Add("sk_live_abuser")
	f.Add("0123456789012345678901234567890123456789012345678901234")
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := sum256(s), sha256.Sum256([]byte(s)); got != want {
			t.Fatalf("%q: %x, want %x", s, got, want)
		}
	})
}

// TestAppendKeyed checks the package's HMAC against crypto/hmac (the sync service's
// HashKey), for secrets shorter than, as long as and longer than a block.
func TestAppendKeyed(t *testing.T) {
	long := strings.Repeat("s", 100)
	for _, tc := range []struct{ secret, key string }{
		{"k", ""}, {"key-hash-s3cret", "203.0.113.7"}, {strings.Repeat("b", 64), "sk_live_abuser"},
		{long, strings.Repeat("a-long-key/", 20)}, {"", "x"},
	} {
		m := hmac.New(sha256.New, []byte(tc.secret))
		m.Write([]byte(tc.key))
		want := base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:12])
		if got := string(AppendKeyed(nil, tc.secret, tc.key)); got != want || len(got) != KeyedLen {
			t.Errorf("AppendKeyed(%q, %q) = %q, want %q", tc.secret, tc.key, got, want)
		}
	}
	buf := make([]byte, 0, KeyedLen)
	if n := testing.AllocsPerRun(100, func() { buf = AppendKeyed(buf[:0], "s3cret", "203.0.113.7") }); n != 0 {
		t.Errorf("AppendKeyed allocates %v times", n)
	}
}

func FuzzAppendKeyed(f *testing.F) {
	f.Add("s3cret", "203.0.113.7")
	f.Fuzz(func(t *testing.T, secret, key string) {
		m := hmac.New(sha256.New, []byte(secret))
		m.Write([]byte(key))
		if got, want := string(AppendKeyed(nil, secret, key)), base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:12]); got != want {
			t.Fatalf("AppendKeyed(%q, %q) = %q, want %q", secret, key, got, want)
		}
	})
}

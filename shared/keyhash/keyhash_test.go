package keyhash

import (
	"crypto/sha256"
	"encoding/hex"
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

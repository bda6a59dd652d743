package hashslot

import "testing"

// Values from the Redis Cluster specification and `redis-cli cluster keyslot`.
func TestOf(t *testing.T) {
	tests := []struct {
		key  string
		want int
	}{
		{"123456789", 12739}, // the CRC16/XMODEM check value 0x31C3 mod 16384
		{"foo", 12182},
		{"{user1000}.following", 3443},
		{"{user1000}.followers", 3443},
		{"foo{}{bar}", 8363}, // empty first tag: the whole key is hashed
		{"foo{{bar}}zap", 4015},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			if got := Of(tt.key); got != tt.want {
				t.Fatalf("Of(%q) = %d, want %d", tt.key, got, tt.want)
			}
		})
	}
}

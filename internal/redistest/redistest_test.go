package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestSlot(t *testing.T) {
	// Reference values from CLUSTER KEYSLOT.
	for _, tc := range []struct {
		key  string
		slot int
	}{
		{"foo", 12182},
		{"bar", 5061},
		{"{user1000}.following", 3443},
		{"rl:{user1000}:r:0", 3443},
		{"{}x", Slot("{}x")},
	} {
		t.Run(tc.key, func(t *testing.T) {
			if got := Slot(tc.key); got != tc.slot {
				t.Fatalf("Slot(%q) = %d, want %d", tc.key, got, tc.slot)
			}
		})
	}
}

func TestStandalone(t *testing.T) {
	s := StartStandalone(t)
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer c.Close()
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING answered after Kill")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
}

func TestCluster(t *testing.T) {
	c := StartCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	defer cl.Close()
	for _, k := range []string{"a", "b", "c", "rl:{x}:1"} {
		if err := cl.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatalf("set %q: %v", k, err)
		}
		if got := cl.ClusterKeySlot(ctx, k).Val(); int(got) != Slot(k) {
			t.Fatalf("Slot(%q) = %d, server says %d", k, Slot(k), got)
		}
	}
	before, err := c.PrimaryForKey(ctx, "rl:{x}:1")
	if err != nil {
		t.Fatal(err)
	}
	killed, err := c.KillPrimaryForKey("rl:{x}:1")
	if err != nil {
		t.Fatal(err)
	}
	if killed != before {
		t.Fatalf("killed %s, primary was %s", killed, before)
	}
	after, err := c.PrimaryForKey(ctx, "rl:{x}:1")
	if err != nil || after == before {
		t.Fatalf("primary after failover = %q, %v (before %q)", after, err, before)
	}
	if err := c.Restart(killed); err != nil {
		t.Fatal(err)
	}
	if err := cl.Set(ctx, "rl:{x}:1", "w", 0).Err(); err != nil {
		t.Fatalf("set after failover: %v", err)
	}
}

package top

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/internal/redistest"
)

var (
	standalone *redistest.Server
	cluster    *redistest.Cluster
)

func TestMain(m *testing.M) {
	os.Exit(redistest.RunPackage(m, "top tests", &standalone, &cluster))
}

// TestSketchBounded feeds 1,000,000 distinct keys and a few heavy ones through one
// sketch: it never holds more than its capacity, and the heavy keys come out on top in
// order.
func TestSketchBounded(t *testing.T) {
	const capacity = 256
	s := NewSketch(capacity)
	heavy := map[string]uint64{"heavy-a": 30_000, "heavy-b": 20_000, "heavy-c": 10_000}
	for i := range 1_000_000 {
		s.Add("k"+strconv.Itoa(i), 1)
		if i%100 == 0 {
			s.Add("heavy-a", 3)
			s.Add("heavy-b", 2)
			s.Add("heavy-c", 1)
		}
		if s.Len() > capacity {
			t.Fatalf("after %d keys the sketch holds %d entries, cap %d", i+1, s.Len(), capacity)
		}
	}
	if s.Len() != capacity {
		t.Fatalf("sketch holds %d entries, want the cap %d", s.Len(), capacity)
	}
	top := s.Top(3)
	for i, want := range []string{"heavy-a", "heavy-b", "heavy-c"} {
		if top[i].Key != want {
			t.Fatalf("top[%d] = %+v, want %s (top %+v)", i, top[i], want, top)
		}
		// Space-Saving never understates, and overstates by at most Err.
		if top[i].Count < heavy[want] || top[i].Count-top[i].Err > heavy[want] {
			t.Errorf("%s: count %d err %d, true %d", want, top[i].Count, top[i].Err, heavy[want])
		}
	}
}

func TestSketchExactBelowCapacity(t *testing.T) {
	tests := []struct {
		name string
		adds []Entry
		want []Entry
	}{
		{"empty", nil, []Entry{}},
		{"zero ignored", []Entry{{Key: "a", Count: 0}}, []Entry{}},
		{"sums", []Entry{{Key: "a", Count: 2}, {Key: "b", Count: 5}, {Key: "a", Count: 4}}, []Entry{{Key: "a", Count: 6}, {Key: "b", Count: 5}}},
		{"ties by key", []Entry{{Key: "b", Count: 1}, {Key: "a", Count: 1}}, []Entry{{Key: "a", Count: 1}, {Key: "b", Count: 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewSketch(8)
			for _, e := range tt.adds {
				s.Add(e.Key, e.Count)
			}
			got := s.Top(0)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) && !(len(got) == 0 && len(tt.want) == 0) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestTrackerMemoryBounded: a million distinct keys over a few rules keep at most
// rules × 2 × Capacity entries in process.
func TestTrackerMemoryBounded(t *testing.T) {
	tr := New(nil, Config{Capacity: 64, MaxRules: 3, Hash: func(s string) string { return s }})
	for i := range 1_000_000 {
		tr.Observe("r"+strconv.Itoa(i%5), "k"+strconv.Itoa(i), uint64(i%2), 1)
	}
	if got, limit := tr.Entries(), 3*2*64; got != limit {
		t.Fatalf("%d entries in process, want the bound %d (3 rules tracked of 5)", got, limit)
	}
}

func clients(t *testing.T) map[string]redis.UniversalClient {
	t.Helper()
	out := map[string]redis.UniversalClient{
		"standalone": redis.NewClient(&redis.Options{Addr: standalone.Addr()}),
		"cluster":    redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()}),
	}
	for _, c := range out {
		t.Cleanup(func() { _ = c.Close() })
	}
	return out
}

// TestTrackerRedis: two replicas flush into the shared sorted sets; the refused key is
// on top of the fleet's list, counts add up across replicas and minutes, the sets are
// capped at Keep and expire, and keys are hashes unless raw keys are asked for.
func TestTrackerRedis(t *testing.T) {
	for mode, rdb := range clients(t) {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			rule := fmt.Sprintf("rule-%s-%d", mode, time.Now().UnixNano())
			now := time.Unix(1_700_000_000, 0)
			clock := func() time.Time { return now }
			hash := func(k string) string { return "h:" + k }
			a := New(rdb, Config{Keep: 10, Minutes: 2, Hash: hash, Now: clock})
			b := New(rdb, Config{Keep: 10, Minutes: 2, Hash: hash, Now: clock})
			for i := range 50 {
				a.Observe(rule, "k"+strconv.Itoa(i), 1, 10)
			}
			a.Observe(rule, "abuser", 40, 1)
			b.Observe(rule, "abuser", 60, 1)
			b.Observe(rule, "big", 0, 500)
			for _, tr := range []*Tracker{a, b} {
				if err := tr.Flush(ctx); err != nil {
					t.Fatal(err)
				}
				if tr.Entries() != 0 {
					t.Fatalf("%d entries left after a flush", tr.Entries())
				}
			}
			// A minute later, more refusals: the list sums the last Minutes minutes.
			now = now.Add(time.Minute)
			a.Observe(rule, "abuser", 5, 0)
			if err := a.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			ref, err := a.Top(ctx, rule, Refused, 3)
			if err != nil {
				t.Fatal(err)
			}
			if !ref.Hashed || len(ref.Keys) != 3 || ref.Keys[0] != (Entry{Key: "h:abuser", Count: 105}) {
				t.Fatalf("refused top: %+v", ref)
			}
			con, err := b.Top(ctx, rule, Consumed, 1)
			if err != nil {
				t.Fatal(err)
			}
			if len(con.Keys) != 1 || con.Keys[0] != (Entry{Key: "h:big", Count: 500}) {
				t.Fatalf("consumed top: %+v", con)
			}
			minute := now.Unix()/60 - 1
			for _, by := range []By{Refused, Consumed} {
				k := Key(rule, by, minute)
				n, err := rdb.ZCard(ctx, k).Result()
				if err != nil || n != 10 {
					t.Fatalf("%s holds %d entries (%v), want the cap 10", k, n, err)
				}
				ttl, err := rdb.TTL(ctx, k).Result()
				if err != nil || ttl <= 0 || ttl > 3*time.Minute {
					t.Fatalf("%s TTL %v (%v), want (0, 3m]", k, ttl, err)
				}
			}
			// Three minutes on, the window has passed: nothing to show.
			now = now.Add(2 * time.Minute)
			old, err := a.Top(ctx, rule, Refused, 3)
			if err != nil || len(old.Keys) != 0 {
				t.Fatalf("list after the window: %+v, %v", old, err)
			}
		})
	}
}

func TestTrackerRawKeysAndBounds(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: standalone.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	rule := fmt.Sprintf("raw-%d", time.Now().UnixNano())
	tr := New(rdb, Config{RawKeys: true, Hash: func(string) string { return "hashed" }})
	tr.Observe(rule, "alice", 3, 0)
	if err := tr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := tr.Top(ctx, rule, Refused, 10)
	if err != nil || l.Hashed || len(l.Keys) != 1 || l.Keys[0].Key != "alice" {
		t.Fatalf("raw keys: %+v %v", l, err)
	}
	for _, n := range []int{0, -1, MaxN + 1} {
		if _, err := tr.Top(ctx, rule, Refused, n); err == nil {
			t.Errorf("n=%d accepted", n)
		}
	}
	for _, s := range []string{"", "Refused", "both"} {
		if _, err := ParseBy(s); err == nil {
			t.Errorf("by %q accepted", s)
		}
	}
}

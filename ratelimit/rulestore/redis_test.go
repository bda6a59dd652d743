package rulestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/rule"
)

var (
	standalone *redistest.Server
	cluster    *redistest.Cluster
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	var err error
	if standalone, err = redistest.Launch(redistest.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, "rules tests need Redis:", err)
		return 1
	}
	defer standalone.Stop()
	if cluster, err = redistest.LaunchCluster(redistest.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, "rules tests need a Redis Cluster:", err)
		return 1
	}
	defer cluster.Stop()
	return m.Run()
}

// clients returns a fresh, empty rules namespace per mode (tests of one mode run in
// sequence: the keys are global).
func clients(t *testing.T) map[string]redis.UniversalClient {
	ctx := context.Background()
	s := redis.NewClient(&redis.Options{Addr: standalone.Addr()})
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	t.Cleanup(func() { s.Close(); c.Close() })
	for _, cl := range []redis.UniversalClient{s, c} {
		if err := cl.Del(ctx, currentKey, logKey).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return map[string]redis.UniversalClient{"standalone": s, "cluster": c}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: not within 5 s", what)
		}
	}
}

func TestPutConflictAndVersions(t *testing.T) {
	for name, rdb := range clients(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s := NewRedis(rdb)
			before := uint64(time.Now().UnixMilli())
			v1, err := s.Put(ctx, 0, []byte(`{"rules":[]}`), Record{By: "t", Action: "put"})
			if err != nil || v1 < before || v1 > uint64(time.Now().UnixMilli()) {
				t.Fatalf("first put: %d, %v; want the writer's clock in ms (%d…)", v1, err, before)
			}
			if _, err := s.Put(ctx, 0, []byte(`{}`), Record{}); !errors.Is(err, ErrConflict) {
				t.Fatalf("put on a stale base: %v, want ErrConflict", err)
			}
			set, err := s.Current(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var body map[string]any
			if err := json.Unmarshal(set.Body, &body); err != nil || body["version"] != float64(v1) {
				t.Fatalf("stored body %s, want version %d", set.Body, v1)
			}
			v2, err := s.Update(ctx, Record{Action: "put"}, func(cur *Set) ([]byte, error) { return cur.Body, nil })
			if err != nil || v2 <= v1 {
				t.Fatalf("update: %d %v, want a version above %d", v2, err, v1)
			}
			recs, err := s.Versions(ctx)
			if err != nil || len(recs) != 2 || recs[0].Version != v2 || recs[1].Version != v1 {
				t.Fatalf("versions %+v %v", recs, err)
			}
			if _, err := s.Get(ctx, 77); !errors.Is(err, ErrNotFound) {
				t.Fatalf("missing version: %v", err)
			}
			if _, err := s.Put(ctx, v2, []byte(`[1]`), Record{}); err == nil {
				t.Fatal("a non-object body was stored")
			}
		})
	}
}

// TestVersionsSurviveWipe: after FLUSHALL a new rule set is newer than every version
// written before it, so gateways and service instances that still enforce an old one
// take it (a counter restarting at 1 would look older).
func TestVersionsSurviveWipe(t *testing.T) {
	for name, rdb := range clients(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s := NewRedis(rdb)
			old, err := s.Update(ctx, Record{Action: "put"}, func(*Set) ([]byte, error) { return []byte(`{"rules":[]}`), nil })
			if err != nil {
				t.Fatal(err)
			}
			if err := flushAll(ctx, rdb); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Millisecond)
			v, err := s.Put(ctx, 0, []byte(`{"rules":[]}`), Record{Action: "put"})
			if err != nil || v <= old {
				t.Fatalf("after the wipe: version %d (%v), want above %d", v, err, old)
			}
		})
	}
}

// TestOldBodiesDeleted: the bodies of versions whose records fall off the log are
// deleted, whatever their numbers.
func TestOldBodiesDeleted(t *testing.T) {
	for name, rdb := range clients(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s := NewRedis(rdb)
			var vs []uint64
			for range Keep + 3 {
				v, err := s.Update(ctx, Record{Action: "put"}, func(*Set) ([]byte, error) { return []byte(`{"rules":[]}`), nil })
				if err != nil {
					t.Fatal(err)
				}
				vs = append(vs, v)
			}
			recs, err := s.Versions(ctx)
			if err != nil || len(recs) != Keep {
				t.Fatalf("%d records (%v), want %d", len(recs), err, Keep)
			}
			for i, v := range vs {
				_, err := s.Get(ctx, v)
				if gone := errors.Is(err, ErrNotFound); gone != (i < len(vs)-Keep) {
					t.Fatalf("version %d (#%d): Get = %v, want it gone only if it fell off the log", v, i, err)
				}
			}
		})
	}
}

// TestWatcherPubSub: with the poller off, a new version reaches the watcher through the
// channel alone.
func TestWatcherPubSub(t *testing.T) {
	for name, rdb := range clients(t) {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s := NewRedis(rdb)
			w := NewWatcher(s, nil)
			done := make(chan struct{})
			go func() { defer close(done); w.subscriber(ctx) }()
			defer func() { cancel(); <-done }()
			waitFor(t, "subscribed", w.Subscribed)
			base := w.Version()
			v, err := s.Put(ctx, base, []byte(`{}`), Record{})
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, "version via pub/sub", func() bool { return w.Version() == v })
		})
	}
}

// TestWatcherPolls: with no subscription the poller finds new versions.
func TestWatcherPolls(t *testing.T) {
	for name, rdb := range clients(t) {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s := NewRedis(rdb)
			w := NewWatcher(s, nil)
			done := make(chan struct{})
			go func() { defer close(done); w.poller(ctx) }()
			defer func() { cancel(); <-done }()
			cur, _ := s.CurrentVersion(ctx)
			v, err := s.Put(ctx, cur, []byte(`{}`), Record{})
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, "version via polling", func() bool { return w.Version() == v })
			set, err := w.Current(ctx)
			if err != nil || set.Version != v {
				t.Fatalf("Current: %+v %v", set, err)
			}
		})
	}
}

func TestWithVersion(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{}`, `{"version":5}`},
		{`{"version":1,"rules":[]}`, `{"rules":[],"version":5}`},
		{`null`, `{"version":5}`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := WithVersion([]byte(tc.in), 5)
			if err != nil || string(got) != tc.want {
				t.Fatalf("%s, %v; want %s", got, err, tc.want)
			}
		})
	}
	if _, err := WithVersion([]byte(`[]`), 1); err == nil {
		t.Fatal("array accepted")
	}
}

// flushAll wipes every primary of rdb (a cluster's too).
func flushAll(ctx context.Context, rdb redis.UniversalClient) error {
	if c, ok := rdb.(*redis.ClusterClient); ok {
		return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return n.FlushAll(ctx).Err() })
	}
	return rdb.FlushAll(ctx).Err()
}

// TestPutRefusesInvalid: the store itself refuses a body rule.Parse refuses, whoever
// writes it (the admin API, a rollback, a list edit), naming the field, and the version
// that was current stays current.
func TestPutRefusesInvalid(t *testing.T) {
	ctx := context.Background()
	over := strconv.FormatInt(algo.MaxLimit+1, 10)
	tests := []struct {
		name, body, field string
	}{
		{"limit above the algorithms' maximum", `{"rules":[{"id":"a","limit":` + over + `,"window":"31d"}]}`, "rules[0].limit"},
		{"window longer than the maximum", `{"rules":[{"id":"a","limit":1,"window":` + strconv.FormatInt(algo.MaxWindowUs/1000+1, 10) + `}]}`, "rules[0].window"},
		{"more than one permit per microsecond", `{"rules":[{"id":"a","algorithm":"gcra","limit":1001,"window":"1ms"}]}`, "rules[0].limit"},
		{"not JSON", `{"rules":[`, ""},
	}
	for mode, rdb := range clients(t) {
		t.Run(mode, func(t *testing.T) {
			s := NewRedis(rdb)
			good := []byte(`{"rules":[{"id":"a","limit":1,"window":"1s"}]}`)
			v, err := s.Put(ctx, 0, good, Record{Action: "put"})
			if err != nil {
				t.Fatal(err)
			}
			for _, tt := range tests {
				_, err := s.Put(ctx, v, []byte(tt.body), Record{Action: "put"})
				all := rule.All(err)
				if !errors.Is(err, ErrInvalid) || len(all) == 0 || all[0].Field != tt.field {
					t.Fatalf("%s: Put = %v, want ErrInvalid naming %q", tt.name, err, tt.field)
				}
				cur, err := s.Current(ctx)
				if err != nil || cur.Version != v || !strings.Contains(string(cur.Body), `"limit":1,`) {
					t.Fatalf("%s: current is %v %s, want version %d", tt.name, err, cur.Body, v)
				}
			}
		})
	}
}

package service

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/rulestore"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// usageOf reads the admin API's usage of key.
func (in *instance) usageOf(t testing.TB, key string) store.Usage {
	t.Helper()
	code, _, out := in.do(t, http.MethodGet, "/v1/usage/"+key, adminToken, nil)
	if code != http.StatusOK {
		t.Fatalf("usage: %d %s", code, out)
	}
	var u store.Usage
	decodeJSON(t, out, &u)
	return u
}

// resetKey resets key through the admin API and returns how many Redis keys it deleted.
func (in *instance) resetKey(t testing.TB, key string) int64 {
	t.Helper()
	code, _, out := in.do(t, http.MethodPost, "/v1/reset/"+key, adminToken, nil)
	if code != http.StatusOK {
		t.Fatalf("reset: %d %s", code, out)
	}
	var r struct{ Deleted int64 }
	decodeJSON(t, out, &r)
	return r.Deleted
}

// spend reports the whole limit of a 10/hour rule on key, then checks one more permit
// strictly and returns whether it was admitted.
func (in *instance) spend(t testing.TB, rule, key string) bool {
	t.Helper()
	d := delta(key, rule, algo.TokenBucket, 10, 3_600_000)
	d.Over, d.ElapsedMs = 10, 3_600_000
	if code, r, out := in.post(t, &wire.Batch{Node: uniq("gw"), Seq: uint64(time.Now().UnixMicro()), Deltas: []wire.Delta{d}}); code != http.StatusOK || r.States[0].Flags&wire.StateRefused != 0 {
		t.Fatalf("spending %s on %s: %d %s %+v", rule, key, code, out, r)
	}
	return in.check(t, rule, key)
}

// check asks /v1/check for one permit of rule on key.
func (in *instance) check(t testing.TB, rule, key string) bool {
	t.Helper()
	d := delta(key, rule, algo.TokenBucket, 10, 3_600_000)
	d.Over = 1
	code, _, out := in.do(t, http.MethodPost, "/v1/check", syncSecret, encode(&wire.Batch{Node: uniq("gw"), Seq: 1, Deltas: []wire.Delta{d}}))
	if code != http.StatusOK {
		t.Fatalf("check: %d %s", code, out)
	}
	var r wire.Reply
	if err := wire.DecodeReply(out, &r); err != nil {
		t.Fatal(err)
	}
	return r.States[0].Allowed()
}

// TestAttackInventedTiers: 20,000 tier names a gateway invents (4,000 per batch) are
// refused per delta, create no bucket and fill nothing: a rule added afterwards is fully
// visible to usage and reset, and a key reset is admitted again.
func TestAttackInventedTiers(t *testing.T) {
	srv := redistest.StartStandalone(t)
	in := start(t, opts{addrs: srv.Addrs(), store: func(c *store.Config) { c.ReadTimeout = 10 * time.Second }})
	pushRules(t, in, `{"tiers":[{"name":"gold","keys":["gold-*"]}],"rules":[{"id":"tiered","limit":10,"window":"1h","tiers":{"gold":{"limit":100,"window":"1h"}}}]}`)
	victim := uniq("victim")
	ctx := context.Background()
	for b := 0; b < 5; b++ {
		batch := &wire.Batch{Node: uniq("atk"), Seq: uint64(time.Now().UnixMicro())}
		for i := 0; i < 4000; i++ {
			d := delta(victim, "tiered", algo.TokenBucket, 10, 3_600_000)
			d.Tier, d.Over = "invented-"+strconv.Itoa(b*4000+i), 1
			batch.Deltas = append(batch.Deltas, d)
		}
		code, r, out := in.post(t, batch)
		if code != http.StatusOK {
			t.Fatalf("batch %d: %d %s", b, code, out)
		}
		for i, st := range r.States {
			if st.Flags&wire.StateRefused == 0 || !strings.HasPrefix(st.Reason, "tier:") {
				t.Fatalf("batch %d delta %d (tier %q): %+v, want refused naming the tier", b, i, batch.Deltas[i].Tier, st)
			}
		}
	}
	if keys := in.st.Client().Keys(ctx, store.KeyPrefix(victim)+"*").Val(); len(keys) != 0 {
		t.Fatalf("invented tiers made Redis keys: %v", keys)
	}
	// The defined tier is still a bucket of its own.
	gold := delta(victim, "tiered", algo.TokenBucket, 10, 3_600_000)
	gold.Tier, gold.Over = "gold", 1
	if _, r, _ := in.post(t, &wire.Batch{Node: uniq("gw"), Seq: 1, Deltas: []wire.Delta{gold}}); r == nil || r.States[0].Flags&wire.StateRefused != 0 {
		t.Fatalf("defined tier refused: %+v", r)
	}

	pushRules(t, in, `{"tiers":[{"name":"gold","keys":["gold-*"]}],"rules":[{"id":"tiered","limit":10,"window":"1h","tiers":{"gold":{"limit":100,"window":"1h"}}},{"id":"late","limit":10,"window":"1h"}]}`)
	if in.spend(t, "late", victim) {
		t.Fatal("a key that spent its 10 on late is still admitted")
	}
	u := in.usageOf(t, victim)
	seen := map[string]bool{}
	for _, b := range u.Buckets {
		seen[b.Rule+"/"+b.Tier] = true
	}
	if len(u.Buckets) != 2 || !seen["late/"] || !seen["tiered/gold"] {
		t.Fatalf("usage: %+v, want late and tiered/gold", u.Buckets)
	}
	if n := in.resetKey(t, victim); n != 2 {
		t.Fatalf("reset deleted %d keys, want 2", n)
	}
	if !in.check(t, "late", victim) {
		t.Fatal("key still refused after reset")
	}
}

// TestUsageAfterFlushAll: Redis loses everything (FLUSHALL). Without a restart, the
// instance keeps enforcing its rule set and writes it back into Redis, the admin API
// shows that version, and usage and reset see the buckets traffic makes afterwards.
func TestUsageAfterFlushAll(t *testing.T) {
	srv := redistest.StartStandalone(t)
	in := start(t, opts{addrs: srv.Addrs()})
	pushRules(t, in, `{"rules":[{"id":"wiped","limit":10,"window":"1h"}]}`)
	v := in.svc.Watcher().Version()
	ctx := context.Background()
	rdb := in.st.Client()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "rules written back into Redis", func() bool {
		cur, err := rulestore.NewRedis(rdb).CurrentVersion(ctx)
		return err == nil && cur == v
	})
	code, hdr, out := in.do(t, http.MethodGet, "/v1/rules", adminToken, nil)
	if code != http.StatusOK || hdr.Get(RulesVersionHeader) != strconv.FormatUint(v, 10) {
		t.Fatalf("GET /v1/rules after the wipe: %d version %q %s, want %d", code, hdr.Get(RulesVersionHeader), out, v)
	}
	if got := metricValue(t, in, "tollgate_rules_written_back_total"); got != 1 {
		t.Fatalf("tollgate_rules_written_back_total %v, want 1", got)
	}
	key := uniq("after-wipe")
	if in.spend(t, "wiped", key) {
		t.Fatal("a key that spent its 10 is still admitted")
	}
	if u := in.usageOf(t, key); len(u.Buckets) != 1 || u.Buckets[0].Rule != "wiped" || u.Buckets[0].Remaining != 0 {
		t.Fatalf("usage after the wipe: %+v, want the spent wiped bucket", u.Buckets)
	}
	if n := in.resetKey(t, key); n != 1 {
		t.Fatalf("reset deleted %d, want 1", n)
	}
	if !in.check(t, "wiped", key) {
		t.Fatal("key still refused after reset")
	}
}

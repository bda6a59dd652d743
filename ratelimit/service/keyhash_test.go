package service

import (
	"context"
	"fmt"
	"github.com/tollgate-rl/tollgate/shared/keyhash"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TestKeyHashing: with a key-hash secret, Redis holds no raw IP key (default) or no raw
// key at all (key_hashing all); key_hashing off and a service without the secret store
// them raw. Usage and reset take the raw key either way, and the log never shows it.
func TestKeyHashing(t *testing.T) {
	secret := []byte("key-hash-s3cret")
	// Its own Redis: the rule sets stored here must not reach the package's other tests.
	srv := redistest.StartStandalone(t)
	for _, tc := range []struct {
		name     string
		secret   []byte
		hashing  string // the rule set's key_hashing ("": not set)
		ipRaw    bool   // the IP key appears raw in Redis
		apiRaw   bool   // the API key appears raw in Redis
		ipHashed bool   // the IP key's hash is in Redis
	}{
		{"default", secret, "", false, true, true},
		{"ip", secret, "ip", false, true, true},
		{"all", secret, "all", false, false, true},
		{"off", secret, "off", true, true, false},
		{"no secret", nil, "", true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := start(t, opts{addrs: srv.Addrs(), svc: func(c *Config) { c.KeyHashSecret = tc.secret }})
			rid := uniq("hashed")
			doc := fmt.Sprintf(`{"rules": [{"id": %q, "limit": 100, "window": "1m"}]}`, rid)
			if tc.hashing != "" {
				doc = fmt.Sprintf(`{"key_hashing": %q, "rules": [{"id": %q, "limit": 100, "window": "1m"}]}`, tc.hashing, rid)
			}
			if code, _, out := in.do(t, http.MethodPut, "/v1/rules", adminToken, []byte(doc), "Content-Type", "application/json"); code != http.StatusOK {
				t.Fatalf("PUT /v1/rules: %d %s", code, out)
			}
			ip := fmt.Sprintf("198.%d.%d.%d", 18+rand.IntN(2), rand.IntN(256), 1+rand.IntN(254))
			api := uniq("sk_live")
			var deltas []wire.Delta
			for _, k := range []string{ip, api} {
				deltas = append(deltas, wire.Delta{Key: k, Rule: rid, Algo: uint8(algo.TokenBucket), Limit: 100, WindowMs: 60_000, Over: 3})
			}
			r := in.sync(t, "/v1/sync", &wire.Batch{Node: "gw-1", Seq: 1, Deltas: deltas})
			for i, st := range r.States {
				if st.Key != deltas[i].Key || st.Flags&wire.StateRefused != 0 {
					t.Fatalf("state %d: key %q flags %x reason %q", i, st.Key, st.Flags, st.Reason)
				}
			}
			keys := scanAll(t, in.st)
			has := func(s string) bool {
				for _, k := range keys {
					if strings.Contains(k, s) {
						return true
					}
				}
				return false
			}
			if has(ip) != tc.ipRaw || has(api) != tc.apiRaw || has(HashKey(secret, ip)) != tc.ipHashed {
				t.Fatalf("Redis holds the IP raw %v, the API key raw %v, the IP's hash %v; want %v %v %v",
					has(ip), has(api), has(HashKey(secret, ip)), tc.ipRaw, tc.apiRaw, tc.ipHashed)
			}
			for _, k := range []string{ip, api} {
				code, _, out := in.do(t, http.MethodGet, "/v1/usage/"+k, adminToken, nil)
				if code != http.StatusOK || !strings.Contains(string(out), `"available_without_leases": 97`) {
					t.Fatalf("usage of %s: %d %s", k, code, out)
				}
				code, _, out = in.do(t, http.MethodPost, "/v1/reset/"+k, adminToken, nil)
				if code != http.StatusOK || !strings.Contains(string(out), `"deleted": 1`) {
					t.Fatalf("reset of %s: %d %s", k, code, out)
				}
			}
			if logs := in.log.String(); strings.Contains(logs, ip) || strings.Contains(logs, api) {
				t.Fatalf("a raw caller key is in the service's log:\n%s", logs)
			}
		})
	}
}

// scanAll lists every key of the store's Redis (SCAN, as an operator would look).
func scanAll(t *testing.T, st *store.Store) []string {
	t.Helper()
	var out []string
	iter := st.Client().Scan(context.Background(), 0, "tg:*", 1000).Iterator()
	for iter.Next(context.Background()) {
		out = append(out, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestHashKey(t *testing.T) {
	a, b := HashKey([]byte("s1"), "203.0.113.7"), HashKey([]byte("s2"), "203.0.113.7")
	if a == b || len(a) != 16 || strings.ContainsAny(a, "{}") || HashKey([]byte("s1"), "203.0.113.7") != a {
		t.Fatalf("HashKey: %q %q", a, b)
	}
}

// TestKeyNamesMatchTheFilter: the service names a key in its logs and /v1/top (logKey)
// exactly as the filter's access-log metadata does — keyhash.AppendKeyed with the
// key-hash secret (telemetry.key_hash_secret), keyhash.String without — so an operator
// joins a refused request's log line to its /v1/top entry.
func TestKeyNamesMatchTheFilter(t *testing.T) {
	for _, secret := range []string{"", "kh-s3cret", strings.Repeat("long-secret/", 8)} {
		s := &Service{cfg: Config{KeyHashSecret: []byte(secret)}}
		for _, key := range []string{"203.0.113.7", "2001:db8::1", "sk_live_abuser", "", strings.Repeat("k", 300)} {
			want := keyhash.String(key)
			if secret != "" {
				want = string(keyhash.AppendKeyed(nil, secret, key))
				if got := HashKey([]byte(secret), key); got != want {
					t.Errorf("HashKey(%q, %q) = %q, the filter's keyed name %q", secret, key, got, want)
				}
			}
			if got := s.logKey(key); got != want {
				t.Errorf("secret %q: logKey(%q) = %q, the filter's name %q", secret, key, got, want)
			}
		}
	}
}

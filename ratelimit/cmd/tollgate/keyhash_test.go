package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/service"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TestCLIHashedKeys: with the service storing IP keys hashed, the operator still types
// the raw IP: usage finds the caller's bucket and reset deletes it, while Redis never
// holds the address.
func TestCLIHashedKeys(t *testing.T) {
	rs := redistest.StartStandalone(t)
	m := service.NewMetrics()
	st, err := store.Open(store.Config{Mode: store.Standalone, Addrs: rs.Addrs(), Lease: lease.DefaultSyncConfig}, m)
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte("cli-key-hash-s3cret")
	svc := service.New(service.Config{SyncSecret: "sync", AdminToken: token, KeyHashSecret: secret, Logger: slog.New(slog.DiscardHandler)}, st, m)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); svc.Run(ctx) }()
	hs := httptest.NewServer(svc.Handler())
	t.Cleanup(func() { hs.Close(); cancel(); <-done; _ = st.Close() })

	const ip = "203.0.113.77"
	body, err := wire.AppendBatch(nil, &wire.Batch{Node: "cli-gw", Seq: 1, Deltas: []wire.Delta{
		{Key: ip, Rule: "search", Algo: uint8(algo.TokenBucket), Limit: 10, WindowMs: 1000, Over: 4},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if code, err := httptestPost(hs.URL+"/v1/sync", "sync", body); err != nil || code != 200 {
		t.Fatalf("POST /v1/sync: %d %v", code, err)
	}
	keys, err := st.Client().Keys(context.Background(), "tg:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	hashed := "tg:{" + service.HashKey(secret, ip) + "}"
	found := false
	for _, k := range keys {
		if strings.Contains(k, ip) {
			t.Fatalf("Redis key %q holds the raw IP", k)
		}
		found = found || strings.HasPrefix(k, hashed)
	}
	if !found {
		t.Fatalf("no key under %s in %v", hashed, keys)
	}
	env := map[string]string{"TOLLGATE_SERVER": hs.URL, "TOLLGATE_ADMIN_TOKEN": token}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"usage", ip}, `"rule": "search"`},
		{[]string{"reset", ip}, "1 Redis keys deleted"},
		{[]string{"usage", ip}, `"buckets": []`},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), tt.args, func(k string) string { return env[k] }, strings.NewReader(""), &stdout, &stderr)
			if code != 0 || !strings.Contains(stdout.String(), tt.want) {
				t.Fatalf("exit %d, stdout %s, stderr %s; want %q", code, stdout.String(), stderr.String(), tt.want)
			}
		})
	}
}

package main

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/redistest"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(config) bool
		wantErr string
	}{
		{name: "defaults", check: func(c config) bool {
			return c.listen == ":8081" && c.redisMode == "standalone" && c.leaseHorizon == 10*time.Second && c.leaseEpoch == 20*time.Second
		}},
		{name: "env", env: map[string]string{"TOLLGATE_REDIS_MODE": "cluster", "TOLLGATE_REDIS_ADDRS": "a:1,b:2", "TOLLGATE_LEASE_EPOCH": "5s"},
			check: func(c config) bool {
				sc := c.storeConfig()
				return sc.Mode == "cluster" && len(sc.Addrs) == 2 && sc.Lease.EpochMs == 5_000
			}},
		{name: "flag beats env", args: []string{"--listen", ":9"}, env: map[string]string{"TOLLGATE_LISTEN": ":7"}, check: func(c config) bool { return c.listen == ":9" }},
		{name: "zero retries means none", args: []string{"--redis-max-retries", "0"}, check: func(c config) bool { return c.storeConfig().MaxRetries < 0 }},
		{name: "bad env duration", env: map[string]string{"TOLLGATE_PENALTY_MAX": "soon"}, wantErr: "TOLLGATE_PENALTY_MAX"},
		{name: "horizon too long", args: []string{"--lease-horizon", "3m"}, wantErr: "--lease-horizon"},
		{name: "epoch too short", args: []string{"--lease-epoch", "10ms"}, wantErr: "--lease-epoch"},
		{name: "penalty max below base", args: []string{"--penalty-base", "10s", "--penalty-max", "1s"}, wantErr: "--penalty-max"},
		{name: "stray argument", args: []string{"serve"}, wantErr: "unexpected arguments"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			c, err := parseConfig(tc.args, env(tc.env), &out)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.check(c) {
				t.Fatalf("config %+v, err %v", c, err)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"--help"}, env(nil), &out, &errOut, nil); code != 0 {
		t.Fatalf("--help exited %d: %s", code, errOut.String())
	}
	for _, want := range []string{"/v1/sync", "--redis-mode [TOLLGATE_REDIS_MODE]", "--sync-secret [TOLLGATE_SYNC_SECRET]", "--lease-horizon"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help lacks %q:\n%s", want, out.String())
		}
	}
}

// TestServeAndShutdown runs the binary's main loop against real Redis, checks it serves,
// and that cancelling (SIGTERM) drains and exits 0.
func TestServeAndShutdown(t *testing.T) {
	srv := redistest.StartStandalone(t)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan int, 1)
	var logs bytes.Buffer
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--log-format", "text"},
			env(map[string]string{"TOLLGATE_REDIS_ADDRS": srv.Addr(), "TOLLGATE_ADMIN_TOKEN": "t"}), &logs, &logs, ready)
	}()
	var addr string
	select {
	case addr = <-ready:
	case code := <-done:
		t.Fatalf("exited %d before serving", code)
	}
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz: %d", resp.StatusCode)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit code %d after shutdown", code)
	}
}

package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/rulestore"
	"github.com/tollgate-rl/tollgate/ratelimit/service"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

var redisSrv *redistest.Server

func TestMain(m *testing.M) {
	os.Exit(func() int {
		store.RouteRedisLogs(slog.New(slog.DiscardHandler))
		var err error
		if redisSrv, err = redistest.Launch(redistest.Options{}); err != nil {
			fmt.Fprintln(os.Stderr, "tollgate CLI tests need Redis:", err)
			return 1
		}
		defer redisSrv.Stop()
		return m.Run()
	}())
}

const token = "cli-admin-t0ken"

// startService runs a real sync service on the test's Redis and returns its admin URL.
func startService(t *testing.T) (*service.Service, string) {
	t.Helper()
	m := service.NewMetrics()
	st, err := store.Open(store.Config{Mode: store.Standalone, Addrs: redisSrv.Addrs(), Lease: lease.DefaultSyncConfig}, m)
	if err != nil {
		t.Fatal(err)
	}
	svc := service.New(service.Config{SyncSecret: "sync", AdminToken: token, Logger: slog.New(slog.DiscardHandler)}, st, m)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); svc.Run(ctx) }()
	hs := httptest.NewServer(svc.Handler())
	t.Cleanup(func() { hs.Close(); cancel(); <-done; _ = st.Close() })
	// Another test may have left a rule set in the shared Redis: wait until the service
	// serves it, so that what a test reads first is not a load still on its way.
	cur, err := rulestore.NewRedis(st.Client()).CurrentVersion(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); svc.Watcher().Version() != cur; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("service at rules version %d, Redis at %d", svc.Watcher().Version(), cur)
		}
	}
	return svc, hs.URL
}

// closedURL is an address nothing listens on.
func closedURL(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

// TestCLI drives every command against a real service and Redis, in order (apply
// before diff, history and rollback), with the failures an operator meets: no token,
// a wrong token, a rule set the service refuses (422, field named), a server that is
// not there, a wrong command line.
func TestCLI(t *testing.T) {
	svc, url := startService(t)
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	v1 := write("v1.yaml", "rules:\n  - id: search\n    limit: 10\n    window: 1s\n  - id: login\n    limit: 5\n    window: 1m\n")
	same := write("same.json", `{"rules":[{"window":"1m","limit":5,"id":"login"},{"id":"search","limit":10,"window":"1s"}]}`)
	v2 := write("v2.json", `{"rules":[{"id":"search","limit":20,"window":"1s"},{"id":"export","limit":1,"window":"1h"}]}`)
	bad := write("bad.json", `{"rules":[{"id":"search","limit":0,"window":"1s"}]}`)
	tokenFile := write("token", token+"\n")

	// A caller that one rule refuses, for usage, top and reset.
	key := fmt.Sprintf("cli-user-%d", os.Getpid())
	body, err := wire.AppendBatch(nil, &wire.Batch{Node: "cli-gw", Seq: 1, Deltas: []wire.Delta{
		{Key: key, Rule: "search", Algo: uint8(algo.TokenBucket), Limit: 10, WindowMs: 1000, Over: 10, Rejected: 7},
	}})
	if err != nil {
		t.Fatal(err)
	}
	syncOnce := func() {
		resp, err := httptestPost(url+"/v1/sync", "sync", body)
		if err != nil || resp != 200 {
			t.Fatalf("POST /v1/sync: %d %v", resp, err)
		}
		if err := svc.Top().Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}

	env := map[string]string{"TOLLGATE_SERVER": url, "TOLLGATE_ADMIN_TOKEN": token, "TOLLGATE_ACTOR": "cli-test"}
	tests := []struct {
		name   string
		args   []string
		env    map[string]string // replaces env's entries ("" unsets)
		before func()
		code   int
		stdout []string
		stderr []string
	}{
		{"validate offline", []string{"rules", "validate", bad}, map[string]string{"TOLLGATE_SERVER": closedURL(t)}, nil, 1, nil, []string{"rules[0].limit: must be > 0"}},
		{"validate ok", []string{"rules", "validate", v1}, nil, nil, 0, []string{"v1.yaml: valid: 2 rules"}, nil},
		{"no token", []string{"rules", "history"}, map[string]string{"TOLLGATE_ADMIN_TOKEN": ""}, nil, 1, nil, []string{"401 Unauthorized: no admin token: set TOLLGATE_ADMIN_TOKEN"}},
		{"wrong token", []string{"usage", key}, map[string]string{"TOLLGATE_ADMIN_TOKEN": "nope"}, nil, 1, nil, []string{"401 Unauthorized: the service refused the admin token"}},
		{"unreachable", []string{"rules", "apply", v1}, map[string]string{"TOLLGATE_SERVER": closedURL(t)}, nil, 1, nil, []string{"cannot reach the service at http://127.0.0.1:", "connection refused"}},
		{"unreachable flag wins", []string{"--server", closedURL(t), "top", "search"}, nil, nil, 1, nil, []string{"cannot reach the service"}},
		{"apply refused 422", []string{"rules", "apply", bad}, nil, nil, 1, nil, []string{"422 the service refused the rule set:", "rules[0].limit: must be > 0"}},
		{"apply v1", []string{"rules", "apply", v1}, nil, nil, 0, []string{"applied ", "v1.yaml: rules version "}, nil},
		{"diff same", []string{"rules", "diff", same}, nil, nil, 0, []string{"same.json: no change"}, nil},
		{"diff v2", []string{"rules", "diff", v2}, nil, nil, 1, []string{"+ rule export", "- rule login", "~ rule search", `was {"id":"search","limit":10,"window":"1s"}`}, nil},
		{"apply v2 token file", []string{"--admin-token-file", tokenFile, "rules", "apply", v2}, map[string]string{"TOLLGATE_ADMIN_TOKEN": ""}, nil, 0, []string{"v2.json: rules version "}, nil},
		{"history", []string{"rules", "history"}, nil, nil, 0, []string{"VERSION", "{v1}  ", "cli-test", "put", "{v2}  ", "(current)"}, nil},
		{"rollback", []string{"rules", "rollback", "{v1}"}, nil, nil, 0, []string{"rolled back to version {v1}'s rules: rules version "}, nil},
		{"diff after rollback", []string{"rules", "diff", same}, nil, nil, 0, []string{"no change"}, nil},
		{"rollback missing", []string{"rules", "rollback", "99"}, nil, nil, 1, nil, []string{"404 Not Found", "field version"}},
		{"rollback not a number", []string{"rules", "rollback", "one"}, nil, nil, 2, nil, []string{`VERSION "one" is not a positive integer`}},
		{"usage", []string{"usage", key}, nil, syncOnce, 0, []string{`"rule": "search"`}, nil},
		{"top refused", []string{"top", "search"}, nil, nil, 0, []string{"rule search, by refused", "key hash", "1  ", "7  ", service.KeyHash(key)}, nil},
		{"top consumed", []string{"top", "search", "--by", "consumed", "--n", "1"}, nil, nil, 0, []string{"CONSUMED", "10  ", service.KeyHash(key)}, nil},
		{"top bad by", []string{"top", "search", "--by", "both"}, nil, nil, 2, nil, []string{`--by "both"`}},
		{"top bad n", []string{"top", "search", "--n", "0"}, nil, nil, 1, nil, []string{"400 Bad Request", "field n"}},
		{"reset", []string{"reset", key}, nil, nil, 0, []string{"reset: ", "Redis keys deleted"}, nil},
		{"no command", nil, nil, nil, 2, nil, []string{"usage: tollgate"}},
		{"unknown command", []string{"frobnicate"}, nil, nil, 2, nil, []string{`unknown command "frobnicate"`}},
		{"missing file", []string{"rules", "apply", filepath.Join(dir, "nope.json")}, nil, nil, 1, nil, []string{"no such file"}},
	}
	// Versions are the service's; "{v1}" and "{v2}" stand for those the applies got.
	versions := map[string]string{}
	subst := func(in []string) []string {
		out := make([]string, len(in))
		for i, s := range in {
			for k, v := range versions {
				s = strings.ReplaceAll(s, k, v)
			}
			out[i] = s
		}
		return out
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.args, tt.stdout = subst(tt.args), subst(tt.stdout)
			if tt.before != nil {
				tt.before()
			}
			e := map[string]string{}
			for k, v := range env {
				e[k] = v
			}
			for k, v := range tt.env {
				e[k] = v
			}
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), tt.args, func(k string) string { return e[k] }, strings.NewReader(""), &stdout, &stderr)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout.String(), stderr.String())
			}
			for _, c := range []struct {
				name, got string
				want      []string
			}{{"stdout", stdout.String(), tt.stdout}, {"stderr", stderr.String(), tt.stderr}} {
				for _, w := range c.want {
					if !strings.Contains(c.got, w) {
						t.Errorf("%s lacks %q:\n%s", c.name, w, c.got)
					}
				}
			}
			if name, ok := strings.CutPrefix(tt.name, "apply v"); ok {
				_, v, _ := strings.Cut(stdout.String(), "rules version ")
				versions["{v"+name[:1]+"}"] = strings.TrimSpace(v)
			}
			if code != 0 && code != 1 || tt.name == "diff v2" {
				return
			}
			if code == 1 && stderr.Len() == 0 {
				t.Errorf("exit 1 without a message on stderr")
			}
		})
	}
}

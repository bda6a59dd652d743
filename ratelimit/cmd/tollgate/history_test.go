package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/internal/pgtest"
	"github.com/tollgate-rl/tollgate/ratelimit/rulestore/postgres"
	"github.com/tollgate-rl/tollgate/ratelimit/service"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/lease"
)

// TestHistoryFromPolicyStore: with a policy store (a real PostgreSQL), three applies by
// three authors, each with --reason, are listed by `rules history` with author and
// reason, newest first.
func TestHistoryFromPolicyStore(t *testing.T) {
	pg := pgtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	pol, err := postgres.Open(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	m := service.NewMetrics()
	st, err := store.Open(store.Config{Mode: store.Standalone, Addrs: redisSrv.Addrs(), Lease: lease.DefaultSyncConfig}, m)
	if err != nil {
		t.Fatal(err)
	}
	svc := service.New(service.Config{SyncSecret: "sync", AdminToken: token, Logger: slog.New(slog.DiscardHandler), Policy: pol}, st, m)
	done := make(chan struct{})
	go func() { defer close(done); svc.Run(ctx) }()
	hs := httptest.NewServer(svc.Handler())
	t.Cleanup(func() { hs.Close(); cancel(); <-done; _ = st.Close(); pol.Close() })

	file := t.TempDir() + "/rules.json"
	for i, who := range []string{"alice", "bob", "carol"} {
		body := `{"rules":[{"id":"search","limit":` + string(rune('1'+i)) + `,"window":"1s"}]}`
		if err := writeFile(file, body); err != nil {
			t.Fatal(err)
		}
		env := map[string]string{"TOLLGATE_SERVER": hs.URL, "TOLLGATE_ADMIN_TOKEN": token, "TOLLGATE_ACTOR": who}
		var stdout, stderr bytes.Buffer
		if code := run(ctx, []string{"--reason", "step " + who, "rules", "apply", file}, func(k string) string { return env[k] }, strings.NewReader(""), &stdout, &stderr); code != 0 {
			t.Fatalf("apply as %s: exit %d: %s", who, code, stderr.String())
		}
	}
	env := map[string]string{"TOLLGATE_SERVER": hs.URL, "TOLLGATE_ADMIN_TOKEN": token}
	var stdout, stderr bytes.Buffer
	if code := run(ctx, []string{"rules", "history"}, func(k string) string { return env[k] }, strings.NewReader(""), &stdout, &stderr); code != 0 {
		t.Fatalf("history: exit %d: %s", code, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 4 || !strings.Contains(lines[0], "REASON") {
		t.Fatalf("history:\n%s\nwant a header and three versions", stdout.String())
	}
	for i, who := range []string{"carol", "bob", "alice"} {
		if l := lines[i+1]; !strings.Contains(l, who) || !strings.Contains(l, `"step `+who+`"`) || !strings.Contains(l, "put") {
			t.Errorf("history line %d %q, want author %s and reason %q", i+1, l, who, "step "+who)
		}
	}
	if !strings.Contains(lines[1], "(current)") {
		t.Errorf("newest line %q is not marked current", lines[1])
	}
}

func writeFile(name, body string) error { return os.WriteFile(name, []byte(body), 0o600) }

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TestRedisTLSAndACL runs the service against TLS-only Redis (standalone requiring a
// client certificate, Sentinel, Cluster) with an ACL user whose password comes from a
// file: syncs reach Redis in every mode. Then it starts the service with one setting
// wrong at a time: each stops the start with a message naming that setting.
func TestRedisTLSAndACL(t *testing.T) {
	dir := t.TempDir()
	files, err := redistest.GenerateTLS(filepath.Join(dir, "pki"))
	if err != nil {
		t.Fatal(err)
	}
	files.RequireClientCert = true
	other, err := redistest.GenerateTLS(filepath.Join(dir, "other-pki"))
	if err != nil {
		t.Fatal(err)
	}
	o := redistest.Options{TLS: files, User: "tollgate", Password: "acl-pass-1"}
	srv := redistest.StartStandaloneWith(t, o)
	sen, err := redistest.LaunchSentinel(srv.Addr(), "tgm", o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sen.Stop)
	cluster := redistest.StartClusterWith(t, o)

	passFile := writeFile(t, dir, "redis-password", "acl-pass-1\n")
	wrongPass := writeFile(t, dir, "wrong-password", "not-it\n")
	garbageCA := writeFile(t, dir, "garbage-ca", "not a certificate\n")
	tlsArgs := func(ca string) []string {
		return []string{"--redis-tls-ca-file", ca, "--redis-tls-cert-file", files.ClientCertFile, "--redis-tls-key-file", files.ClientKey,
			"--redis-username", "tollgate"}
	}
	modes := []struct {
		name string
		args []string
	}{
		{"standalone", []string{"--redis-addrs", "rediss://" + srv.Addr()}},
		{"sentinel", []string{"--redis-mode", "sentinel", "--redis-master", "tgm", "--redis-tls", "--redis-addrs", sen.Addr()}},
		{"cluster", []string{"--redis-mode", "cluster", "--redis-addrs", "rediss://" + strings.Join(cluster.Addrs()[:2], ",rediss://")}},
	}
	for _, m := range modes {
		t.Run(m.name+"/syncs", func(t *testing.T) {
			args := append(append(append([]string{}, m.args...), tlsArgs(files.CAFile)...), "--redis-password-file", passFile)
			l, stop := startService(t, args)
			defer stop()
			const limit, over = 100, 3
			b := &wire.Batch{Node: "gw-" + m.name, Seq: uint64(time.Now().UnixMicro()), Deltas: []wire.Delta{
				{Key: "tls-" + m.name, Rule: "r", Over: over, Algo: uint8(algo.TokenBucket), Limit: limit, WindowMs: 60_000}}}
			rep := postSync(t, l.sync, b)
			if len(rep.States) != 1 || rep.States[0].Remaining > limit-over {
				t.Fatalf("reply %+v: want one state with at most %d remaining (Redis charged)", rep, limit-over)
			}
			if code := status(t, "GET", "http://"+l.sync+"/readyz", ""); code != http.StatusOK {
				t.Fatalf("/readyz: %d", code)
			}
		})
	}

	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantMsg  string
	}{
		{"wrong password", append(tlsArgs(files.CAFile), "--redis-password-file", wrongPass), 1, "--redis-password-file"},
		{"no password", tlsArgs(files.CAFile), 1, "--redis-password-file"},
		{"wrong CA", append(tlsArgs(other.CAFile), "--redis-password-file", passFile), 1, "--redis-tls-ca-file"},
		{"wrong server name", append(tlsArgs(files.CAFile), "--redis-password-file", passFile, "--redis-tls-server-name", "redis.example.com"), 1, "--redis-tls-server-name"},
		{"no client certificate", []string{"--redis-tls-ca-file", files.CAFile, "--redis-username", "tollgate", "--redis-password-file", passFile}, 1, "--redis-tls-cert-file"},
		{"CA file without a certificate", append(tlsArgs(garbageCA), "--redis-password-file", passFile), 2, "--redis-tls-ca-file"},
		{"certificate without key", []string{"--redis-tls-ca-file", files.CAFile, "--redis-tls-cert-file", files.ClientCertFile}, 2, "--redis-tls-key-file"},
		{"CA without TLS", []string{"--redis-tls-ca-file", files.CAFile}, 2, "--redis-tls"},
	}
	for _, m := range modes {
		for _, tc := range tests {
			if m.name != "standalone" && tc.wantCode == 2 {
				continue // flag errors do not depend on the mode
			}
			t.Run(m.name+"/"+tc.name, func(t *testing.T) {
				args := append(append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-format", "text"},
					strings.Fields(strings.ReplaceAll(strings.Join(m.args, " "), "rediss://", ""))...), tc.args...)
				if !strings.Contains(strings.Join(args, " "), "--redis-tls ") && tc.name != "CA without TLS" {
					args = append(args, "--redis-tls")
				}
				var out bytes.Buffer
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				code := run(ctx, args, env(map[string]string{"TOLLGATE_SYNC_SECRET": "s"}), io.Discard, &out, nil)
				if code != tc.wantCode || !strings.Contains(out.String(), tc.wantMsg) {
					t.Fatalf("exit %d, want %d with a message naming %s; stderr:\n%s", code, tc.wantCode, tc.wantMsg, out.String())
				}
				t.Log(strings.TrimSpace(out.String()))
				if strings.Contains(out.String(), "acl-pass-1") {
					t.Fatalf("stderr shows the password:\n%s", out.String())
				}
			})
		}
	}
}

// startService runs the service in-process with args (listeners on free loopback
// ports, sync secret "s") until stop.
func startService(t *testing.T, args []string) (listening, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan listening, 1)
	done := make(chan int, 1)
	logs := &lockedBuffer{}
	go func() {
		done <- run(ctx, append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-format", "text"}, args...),
			env(map[string]string{"TOLLGATE_SYNC_SECRET": "s"}), logs, logs, ready)
	}()
	select {
	case l := <-ready:
		return l, func() {
			cancel()
			if code := <-done; code != 0 {
				t.Errorf("exit %d after shutdown: %s", code, logs)
			}
		}
	case code := <-done:
		cancel()
		t.Fatalf("exited %d before serving: %s", code, logs)
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatalf("not serving within 60 s: %s", logs)
	}
	panic("unreachable")
}

// postSync sends b to /v1/sync with the secret "s" and decodes the 200 reply.
func postSync(t *testing.T, addr string, b *wire.Batch) *wire.Reply {
	t.Helper()
	rep, err := syncOnce(addr, b)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// syncOnce is postSync for other goroutines than the test's.
func syncOnce(addr string, b *wire.Batch) (*wire.Reply, error) {
	body, err := wire.AppendBatch(nil, b)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequest("POST", "http://"+addr+"/v1/sync", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer s")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/v1/sync: %d %s", resp.StatusCode, data)
	}
	var rep wire.Reply
	if err := wire.DecodeReply(data, &rep); err != nil {
		return nil, fmt.Errorf("decode reply: %w", err)
	}
	return &rep, nil
}

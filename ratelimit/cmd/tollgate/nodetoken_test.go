package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TestCLINodeToken: the token `tollgate node-token` prints from the service's sync
// secret file lets that node sync, and only that node.
func TestCLINodeToken(t *testing.T) {
	_, url := startService(t) // master secret "sync"
	file := filepath.Join(t.TempDir(), "sync-secret")
	if err := os.WriteFile(file, []byte("\n  sync  \nolder-master\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	env := map[string]string{"TOLLGATE_SYNC_SECRET_FILE": file}
	if code := run(context.Background(), []string{"node-token", "gw-7"}, func(k string) string { return env[k] }, strings.NewReader(""), &stdout, &stderr); code != 0 {
		t.Fatalf("node-token: exit %d: %s", code, stderr.String())
	}
	tok := strings.TrimSpace(stdout.String())
	post := func(node string) int {
		body, err := wire.AppendBatch(nil, &wire.Batch{Node: node, Seq: uint64(time.Now().UnixMicro()), Deltas: []wire.Delta{
			{Key: "cli-token-key", Rule: "r", Algo: uint8(algo.TokenBucket), Limit: 10, WindowMs: 1000, Over: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		code, err := httptestPost(url+"/v1/sync", tok, body)
		if err != nil {
			t.Fatal(err)
		}
		return code
	}
	if code := post("gw-7"); code != http.StatusOK {
		t.Fatalf("gw-7 with its token: %d", code)
	}
	if code := post("gw-8"); code != http.StatusForbidden {
		t.Fatalf("gw-8 with gw-7's token: %d, want 403", code)
	}

	for name, args := range map[string][]string{
		"no node":         {"node-token"},
		"two nodes":       {"node-token", "a", "b"},
		"no secret file":  {"node-token", "--sync-secret-file", "", "gw"},
		"node with space": {"node-token", "--sync-secret-file", file, "gw 1"},
		"missing file":    {"node-token", "--sync-secret-file", file + ".missing", "gw"},
	} {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), args, func(string) string { return "" }, strings.NewReader(""), &stdout, &stderr); code == 0 || stdout.Len() != 0 {
				t.Fatalf("exit %d, stdout %q: want a failure and no token", code, stdout.String())
			}
		})
	}
}

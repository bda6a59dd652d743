package main

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/credential"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TestGatewayCredentials runs the service as its command line starts it and syncs with
// each kind of credential: a node token for its node (200), for another node (403), the
// master secret with --sync-node-tokens-only (401), and, under --sync-identity mesh, an
// x-forwarded-client-cert from the loopback sidecar (200) or nothing (401).
func TestGatewayCredentials(t *testing.T) {
	srv := redistest.StartStandalone(t)
	master := writeFile(t, t.TempDir(), "sync", "master-one\nmaster-two\n")
	base := []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--redis-addrs", srv.Addr(), "--log-format", "text"}
	serve := func(t *testing.T, args ...string) string {
		ctx, cancel := context.WithCancel(context.Background())
		ready := make(chan listening, 1)
		done := make(chan int, 1)
		logs := &lockedBuffer{}
		go func() { done <- run(ctx, append(append([]string{}, base...), args...), env(nil), logs, logs, ready) }()
		t.Cleanup(func() { cancel(); <-done })
		select {
		case l := <-ready:
			return "http://" + l.sync
		case code := <-done:
			t.Fatalf("exit %d: %s", code, logs)
		}
		return ""
	}
	post := func(t *testing.T, url, node, bearer string, hdr ...string) int {
		body, err := wire.AppendBatch(nil, &wire.Batch{Node: node, Seq: uint64(time.Now().UnixMicro()), Deltas: []wire.Delta{
			{Key: "cred-key", Rule: "r", Algo: uint8(algo.TokenBucket), Limit: 10, WindowMs: 1000, Over: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/sync", bytes.NewReader(body))
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	tok := func(m, node string) string {
		s, err := credential.Issue([]byte(m), node)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	t.Run("node tokens", func(t *testing.T) {
		url := serve(t, "--sync-secret-file", master, "--sync-node-tokens-only")
		for _, tc := range []struct {
			name, node, bearer string
			want               int
		}{
			{"own node", "gw-a", tok("master-one", "gw-a"), http.StatusOK},
			{"second master line", "gw-b", tok("master-two", "gw-b"), http.StatusOK},
			{"another node", "gw-b", tok("master-one", "gw-a"), http.StatusForbidden},
			{"master secret itself", "gw-a", "master-one", http.StatusUnauthorized},
			{"unknown master", "gw-a", tok("master-three", "gw-a"), http.StatusUnauthorized},
		} {
			if got := post(t, url, tc.node, tc.bearer); got != tc.want {
				t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
			}
		}
	})
	t.Run("mesh identity", func(t *testing.T) {
		url := serve(t, "--sync-identity", "mesh")
		xfcc := "By=spiffe://td/ns/tollgate/sa/svc;URI=spiffe://td/ns/gw/sa/ingress"
		if got := post(t, url, "pod-1", "", "X-Forwarded-Client-Cert", xfcc); got != http.StatusOK {
			t.Errorf("peer through the loopback sidecar: %d, want 200", got)
		}
		if got := post(t, url, "pod-1", ""); got != http.StatusUnauthorized {
			t.Errorf("no identity: %d, want 401", got)
		}
	})
}

package main

import (
	"bytes"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// buildProbe builds the host package's test guest, which answers per request path.
func buildProbe(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "probe.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, "../../../internal/wazerohost/testdata/probe")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build probe: %v\n%s", err, b)
	}
	return out
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
		check   func(t *testing.T, o options)
	}{
		{name: "missing wasm", args: nil, wantErr: "--wasm is required"},
		{name: "bad workers", args: []string{"--wasm", "f.wasm", "--workers", "0"}, wantErr: "want at least 1"},
		{name: "bad cluster", args: []string{"--wasm", "f.wasm", "--cluster", "svc"}, wantErr: "want name=host:port"},
		{name: "bad endpoint", args: []string{"--wasm", "f.wasm", "--cluster", "svc=nohostport"}, wantErr: "endpoint"},
		{name: "bad log level", args: []string{"--wasm", "f.wasm", "--log-level", "loud"}, wantErr: "--log-level"},
		{name: "stray argument", args: []string{"--wasm", "f.wasm", "extra"}, wantErr: "unexpected arguments"},
		{name: "bad access log format", args: []string{"--wasm", "f.wasm", "--access-log-format", "%BYTES_SENT%"}, wantErr: "unsupported operator %BYTES_SENT%"},
		{name: "repeated clusters", args: []string{"--wasm", "f.wasm", "--cluster", "a=127.0.0.1:1,127.0.0.1:2", "--cluster", "b=[::1]:3", "--node-id", "n1"},
			check: func(t *testing.T, o options) {
				if len(o.clusters["a"]) != 2 || o.clusters["b"][0] != "[::1]:3" || o.nodeID != "n1" || o.workers != 2 {
					t.Errorf("options = %+v", o)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseFlags(tt.args, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, o)
		})
	}
}

func TestHelpMentionsEveryFlag(t *testing.T) {
	var buf bytes.Buffer
	_, err := parseFlags([]string{"--help"}, &buf)
	if err == nil {
		t.Fatal("--help did not stop parsing")
	}
	for _, f := range []string{"--wasm", "-config", "-workers", "-listen", "-upstream", "-cluster", "-metrics-listen", "-node-id", "-access-log", "SIGHUP", "/metrics"} {
		if !strings.Contains(buf.String(), strings.TrimLeft(f, "-")) {
			t.Errorf("help lacks %q", f)
		}
	}
}

func TestGatewayProxiesThroughTheFilter(t *testing.T) {
	wasm := buildProbe(t)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-replace", "original")
		w.Header().Set("x-backend-saw-probe", r.Header.Get("x-probe"))
		_, _ = io.WriteString(w, "backend "+r.URL.RequestURI())
	}))
	defer backend.Close()

	accessLog := filepath.Join(t.TempDir(), "access.log")
	tokenFile := filepath.Join(t.TempDir(), "admin-token")
	if err := os.WriteFile(tokenFile, []byte("old-token\ngw-adm1n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := parseFlags([]string{"--wasm", wasm, "--upstream", backend.URL, "--node-id", "gw-test", "--access-log", accessLog, "--admin-token-file", tokenFile}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	g, err := newGateway(o, log.New(io.Discard, "", 0))
	if err != nil {
		t.Fatal(err)
	}
	defer g.host.Close()
	defer g.accessLog.Close()
	proxy := httptest.NewServer(g)
	defer proxy.Close()
	admin := httptest.NewServer(g.admin())
	defer admin.Close()

	tests := []struct {
		path       string
		status     int
		bodyPrefix string
		header     [2]string
	}{
		{"/pass?q=1", 200, "backend /pass?q=1", [2]string{"x-backend-saw-probe", "1"}},
		{"/pass", 200, "backend /pass", [2]string{"x-replace", "replaced"}},
		{"/local", 429, "slow down", [2]string{"retry-after", "7"}},
		{"/props", 200, "source.address=127.0.0.1:", [2]string{"x-added", "yes"}},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			resp, err := http.Get(proxy.URL + tt.path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status || !strings.HasPrefix(string(body), tt.bodyPrefix) {
				t.Fatalf("got %d %q", resp.StatusCode, body)
			}
			if got := resp.Header.Get(tt.header[0]); got != tt.header[1] {
				t.Errorf("%s = %q, want %q", tt.header[0], got, tt.header[1])
			}
		})
	}

	t.Run("access log", func(t *testing.T) {
		g.accessLog.flush()
		b, err := os.ReadFile(accessLog)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`"GET /pass?q=1 HTTP/1.1" 200 via_upstream`, `"GET /local HTTP/1.1" 429 `} {
			if !strings.Contains(string(b), want) {
				t.Errorf("access log lacks %q:\n%s", want, b)
			}
		}
	})

	t.Run("reset stream drops the connection", func(t *testing.T) {
		if resp, err := http.Get(proxy.URL + "/close"); err == nil {
			resp.Body.Close()
			t.Fatalf("got status %d, want a dropped connection", resp.StatusCode)
		}
	})

	adminDo := func(t *testing.T, method, path, token, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, admin.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	t.Run("admin", func(t *testing.T) {
		for path, want := range map[string]string{
			"/metrics": "wasmhost_requests_total",
			"/stats":   `"node_id": "gw-test"`,
			"/logs":    "on_log",
		} {
			if _, body := adminDo(t, "GET", path, "gw-adm1n", ""); !strings.Contains(body, want) {
				t.Errorf("%s lacks %q:\n%s", path, want, body)
			}
		}
		if code, _ := adminDo(t, "POST", "/config", "gw-adm1n", "refuse"); code != http.StatusUnprocessableEntity {
			t.Errorf("refused configuration answered %d", code)
		}
		if code, _ := adminDo(t, "POST", "/config", "old-token", "v2"); code != http.StatusOK {
			t.Errorf("accepted configuration answered %d", code)
		}
	})
	t.Run("admin without the token", func(t *testing.T) {
		// A rule set posted by anyone who reaches the listener would open every limit.
		for _, token := range []string{"", "wrong", "gw-adm1"} {
			for _, ep := range []struct{ method, path string }{{"POST", "/config"}, {"GET", "/logs"}} {
				if code, body := adminDo(t, ep.method, ep.path, token, "v3"); code != http.StatusUnauthorized {
					t.Errorf("%s %s with token %q: %d %s, want 401", ep.method, ep.path, token, code, body)
				}
			}
		}
		// Without --admin-token-file nobody may.
		bare := *g
		bare.opts.adminTokens = nil
		srv := httptest.NewServer(bare.admin())
		defer srv.Close()
		resp, err := http.Post(srv.URL+"/config", "text/plain", strings.NewReader("v3"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("POST /config without --admin-token-file: %d, want 401", resp.StatusCode)
		}
	})
}

func FuzzClusterFlag(f *testing.F) {
	for _, seed := range []string{"svc=127.0.0.1:8081", "a=127.0.0.1:1,127.0.0.1:2", "b=[::1]:3", "=x:1", "svc=", "svc", "s=h:1,,"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		c := clusterFlags{}
		if err := c.Set(v); err != nil {
			return
		}
		if len(c) != 1 {
			t.Fatalf("Set(%q) made %d clusters", v, len(c))
		}
		for name, eps := range c {
			if name == "" || len(eps) == 0 {
				t.Fatalf("Set(%q) accepted an empty name or endpoint list: %v", v, c)
			}
			for _, ep := range eps {
				if _, _, err := net.SplitHostPort(ep); err != nil {
					t.Fatalf("Set(%q) kept endpoint %q: %v", v, ep, err)
				}
			}
		}
	})
}

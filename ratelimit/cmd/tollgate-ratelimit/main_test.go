package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
		{name: "rediss addresses mean TLS", args: []string{"--redis-addrs", "rediss://a:1, rediss://b:2"}, check: func(c config) bool {
			a := c.storeConfig().Addrs
			return c.redisTLS && len(a) == 2 && a[0] == "a:1" && a[1] == "b:2"
		}},
		{name: "plain addresses stay plain", args: []string{"--redis-addrs", "redis://a:1"}, check: func(c config) bool {
			return !c.redisTLS && c.storeConfig().Addrs[0] == "a:1"
		}},
		{name: "mixed schemes", args: []string{"--redis-addrs", "rediss://a:1,redis://b:2"}, wantErr: "--redis-addrs"},
		{name: "unknown scheme", args: []string{"--redis-addrs", "http://a:1"}, wantErr: "--redis-addrs"},
		{name: "credentials in the address", args: []string{"--redis-addrs", "rediss://u:pass-in-url@a:1"}, wantErr: "user, password and database are separate"},
		{name: "redis:// with --redis-tls", args: []string{"--redis-tls", "--redis-addrs", "redis://a:1"}, wantErr: "rediss://"},
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
	ready := make(chan listening, 1)
	done := make(chan int, 1)
	var logs bytes.Buffer
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-format", "text"},
			env(map[string]string{"TOLLGATE_REDIS_ADDRS": srv.Addr(), "TOLLGATE_ADMIN_TOKEN": "t", "TOLLGATE_SYNC_SECRET": "s"}), &logs, &logs, ready)
	}()
	var addr string
	select {
	case l := <-ready:
		addr = l.sync
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

// TestStartSecurity: without a sync secret the service does not start unless --insecure
// says so (then it says so loudly, in the log and in a gauge); a secret file that is
// missing, empty or doubled by a value stops the start instead of running open or
// locked.
func TestStartSecurity(t *testing.T) {
	srv := redistest.StartStandalone(t)
	dir := t.TempDir()
	empty := writeFile(t, dir, "empty", "\n  \n")
	good := writeFile(t, dir, "good", "file-secret\n")
	base := []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--redis-addrs", srv.Addr(), "--log-format", "text"}
	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		wantCode int    // exit code when it must not start
		wantLog  string // in the output
	}{
		{name: "no secret", wantCode: 2, wantLog: "no sync secret"},
		{name: "empty secret file", args: []string{"--sync-secret-file", empty}, wantCode: 2, wantLog: "is empty"},
		{name: "missing secret file", args: []string{"--sync-secret-file", dir + "/nope"}, wantCode: 2, wantLog: "no such file"},
		{name: "value and file", args: []string{"--sync-secret-file", good}, env: map[string]string{"TOLLGATE_SYNC_SECRET": "v"}, wantCode: 2, wantLog: "both set"},
		{name: "empty admin token file", args: []string{"--sync-secret-file", good, "--admin-token-file", empty}, wantCode: 2, wantLog: "--admin-token-file"},
		{name: "insecure", args: []string{"--insecure"}, wantLog: "INSECURE MODE"},
		{name: "insecure from the environment", env: map[string]string{"TOLLGATE_INSECURE": "true"}, wantLog: "INSECURE MODE"},
		{name: "secret file", args: []string{"--sync-secret-file", good}},
		{name: "secret on the command line", args: []string{"--sync-secret", "cmdline"}, wantLog: "secret given on the command line"},
		{name: "master secret accepted from gateways (upgrade mode)", args: []string{"--sync-secret-file", good}, wantLog: "--sync-node-tokens-only"},
		{name: "node tokens only", args: []string{"--sync-secret-file", good, "--sync-node-tokens-only"}},
		{name: "mesh identity without a secret", args: []string{"--sync-identity", "mesh"}, wantLog: "mTLS identity"},
		{name: "unknown identity", args: []string{"--sync-identity", "spiffe", "--sync-secret-file", good}, wantCode: 2, wantLog: "--sync-identity"},
		{name: "bad trusted proxy", args: []string{"--sync-identity", "mesh", "--mesh-trusted-proxies", "127.0.0.1"}, wantCode: 2, wantLog: "--mesh-trusted-proxies"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ready := make(chan listening, 1)
			done := make(chan int, 1)
			logs := &lockedBuffer{}
			go func() {
				done <- run(ctx, append(append([]string{}, base...), tc.args...), env(tc.env), logs, logs, ready)
			}()
			var l listening
			select {
			case l = <-ready:
				if tc.wantCode != 0 {
					t.Fatalf("started, want exit %d", tc.wantCode)
				}
			case code := <-done:
				if code != tc.wantCode || tc.wantCode == 0 {
					t.Fatalf("exit %d, want %d: %s", code, tc.wantCode, logs)
				}
				if !strings.Contains(logs.String(), tc.wantLog) {
					t.Fatalf("output lacks %q: %s", tc.wantLog, logs)
				}
				return
			}
			if !strings.Contains(logs.String(), tc.wantLog) {
				t.Errorf("log lacks %q: %s", tc.wantLog, logs)
			}
			insecure := "0"
			if strings.Contains(tc.wantLog, "INSECURE") {
				insecure = "1"
			}
			if got := metric(t, "http://"+l.admin, "tollgate_insecure"); got != insecure {
				t.Errorf("tollgate_insecure %s, want %s", got, insecure)
			}
			cancel()
			if code := <-done; code != 0 {
				t.Fatalf("exit %d after shutdown", code)
			}
		})
	}
}

// TestListenersSeparate: gateways' endpoints answer only on --listen and the admin API
// only on --admin-listen (a network policy can then open one to gateways and the other
// to operators); health and metrics answer on both; "shared" puts both on one port.
func TestListenersSeparate(t *testing.T) {
	srv := redistest.StartStandalone(t)
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprint("shared=", shared), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			adminListen := "127.0.0.1:0"
			if shared {
				adminListen = sharedListener
			}
			ready := make(chan listening, 1)
			done := make(chan int, 1)
			logs := &lockedBuffer{}
			go func() {
				done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--admin-listen", adminListen, "--redis-addrs", srv.Addr()},
					env(map[string]string{"TOLLGATE_SYNC_SECRET": "s", "TOLLGATE_ADMIN_TOKEN": "a"}), logs, logs, ready)
			}()
			var l listening
			select {
			case l = <-ready:
			case code := <-done:
				t.Fatalf("exit %d: %s", code, logs)
			}
			if shared != (l.sync == l.admin) {
				t.Fatalf("sync %s, admin %s", l.sync, l.admin)
			}
			// Each route with the status it gets where it is served; elsewhere (separate
			// listeners) it must be 404, on a shared port it must be served.
			tests := []struct {
				base, method, path, token string
				served                    bool
				want                      int
			}{
				{l.sync, "GET", "/v1/sync/rules", "s", true, http.StatusOK},
				{l.sync, "POST", "/v1/sync", "", true, http.StatusUnauthorized},
				{l.sync, "GET", "/healthz", "", true, http.StatusOK},
				{l.sync, "GET", "/metrics", "", true, http.StatusOK},
				{l.admin, "GET", "/v1/rules/versions", "a", true, http.StatusOK},
				{l.admin, "GET", "/healthz", "", true, http.StatusOK},
				{l.admin, "GET", "/metrics", "", true, http.StatusOK},
				{l.admin, "POST", "/v1/sync", "s", false, 0},
				{l.admin, "GET", "/v1/sync/rules", "s", false, 0},
				{l.sync, "GET", "/v1/rules/versions", "a", false, 0},
				{l.sync, "GET", "/v1/usage/k", "a", false, 0},
				{l.sync, "POST", "/v1/reset/k", "a", false, 0},
			}
			for _, tc := range tests {
				got := status(t, tc.method, "http://"+tc.base+tc.path, tc.token)
				switch {
				case tc.served && got != tc.want:
					t.Errorf("%s %s on %s: %d, want %d", tc.method, tc.path, tc.base, got, tc.want)
				case !tc.served && !shared && got != http.StatusNotFound:
					t.Errorf("%s %s on %s: %d, want 404 (not on this listener)", tc.method, tc.path, tc.base, got)
				case !tc.served && shared && got == http.StatusNotFound:
					t.Errorf("%s %s on the shared port: 404, want it served", tc.method, tc.path)
				}
			}
			cancel()
			<-done
		})
	}
}

func writeFile(t testing.TB, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func status(t testing.TB, method, url, token string) int {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
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
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// metric returns the value of an unlabelled metric on base's /metrics ("" if absent).
func metric(t testing.TB, base, name string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return ""
}

// lockedBuffer is a log sink safe for the service's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRulesValidate: `rules validate FILE` accepts what the admin API accepts (JSON or
// YAML) with a one-line summary and exit 0, and refuses the rest with exit 1 and every
// error on a line of its own, path first.
func TestRulesValidate(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fixture := func(name string) string { return filepath.Join("..", "..", "..", "shared", "rule", "testdata", name) }
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout []string // lines, each a substring
		stderr []string
	}{
		{"valid json", []string{"validate", fixture("valid_full.json")}, 0,
			[]string{"valid_full.json: valid: 5 rules, 12 windows (largest limit 100000, longest window 1d), 3 tiers, 4 allow and 1 deny entries"}, nil},
		{"valid yaml", []string{"validate", write("r.yaml", "rules:\n  - id: day\n    limit: 1000\n    window: 1d\n")}, 0,
			[]string{"r.yaml: valid: 1 rules, 1 windows (largest limit 1000, longest window 1d)"}, nil},
		{"every error", []string{"validate", fixture("several_errors.json")}, 1, nil, []string{
			"several_errors.json: deny[0]: invalid CIDR",
			"several_errors.json: rules[1].windows[0].limit: must be > 0",
			"several_errors.json: rules[1].windows[1].window: must be <= ",
			"several_errors.json: rules[2].fail: must be",
		}},
		{"syntax error offset", []string{"validate", write("broken.json", "{\"rules\": [\n  {\"id\": \"a\",, \"limit\": 1}\n]}")}, 1, nil,
			[]string{`broken.json: configuration: invalid JSON at line 2, column 14 (byte 25): unexpected ',', want a field name`}},
		{"unenforceable", []string{"validate", write("big.json", `{"rules":[{"id":"a","limit":99999999999,"window":"1d"}]}`)}, 1, nil,
			[]string{"big.json: rules[0].limit: must be <= "}},
		{"missing file", []string{"validate", filepath.Join(dir, "nope.json")}, 2, nil, []string{"no such file"}},
		{"usage", []string{"check", "x"}, 2, nil, []string{"usage: tollgate-ratelimit rules validate FILE"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), append([]string{"rules"}, tt.args...), env(nil), &stdout, &stderr, nil)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout.String(), stderr.String())
			}
			for _, c := range []struct {
				out  string
				want []string
			}{{stdout.String(), tt.stdout}, {stderr.String(), tt.stderr}} {
				lines := strings.Split(strings.TrimRight(c.out, "\n"), "\n")
				if len(c.want) == 0 {
					if c.out != "" && tt.code == 0 {
						t.Errorf("unexpected output %q", c.out)
					}
					continue
				}
				if tt.name != "usage" && len(lines) != len(c.want) {
					t.Fatalf("%d lines, want %d: %q", len(lines), len(c.want), c.out)
				}
				for i, w := range c.want {
					if !strings.Contains(lines[i], w) {
						t.Errorf("line %d %q does not contain %q", i, lines[i], w)
					}
				}
			}
		})
	}
}

// TestPolicyStorePasswordOnCommandLine: a password given in --policy-store, in any of
// the forms the PostgreSQL driver reads, is named as a secret on the command line (the
// service warns that ps shows it); a URL without one is not.
func TestPolicyStorePasswordOnCommandLine(t *testing.T) {
	for _, tc := range []struct {
		url    string
		secret bool
	}{
		{"postgres://tollgate@db:5432/tollgate", false},
		{"postgres://tollgate@db:5432/tollgate?sslmode=require&passfile=/etc/pgpass", false},
		{"postgres://tollgate:s3cret@db:5432/tollgate", true},
		{"postgres://tollgate@db:5432/tollgate?sslmode=require&password=s3cret", true},
		{"host=db user=tollgate password=s3cret dbname=tollgate", true},
		{"host=db user=tollgate dbname=tollgate", false},
	} {
		t.Run(tc.url, func(t *testing.T) {
			var out bytes.Buffer
			c, err := parseConfig([]string{"--insecure", "--policy-store", tc.url}, func(string) string { return "" }, &out)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(c.cmdlineSecrets) > 0; got != tc.secret {
				t.Errorf("secrets on the command line %v, want a password found: %v", c.cmdlineSecrets, tc.secret)
			}
		})
	}
}

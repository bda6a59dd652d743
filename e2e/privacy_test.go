package e2e

import (
	"bytes"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
)

// TestLogsNameNoCallerKey: caller keys are credentials (API keys, tokens), so neither
// the service's log nor a gateway's names one. Distinctive keys go through every path
// that logs or answers with an error: admitted requests, refusals, a strict rule (the
// service decides), a key that needs the hashed Redis tag ('}'), the admin API's usage
// and reset (the reset is audited) and oversized or bad admin requests; then the
// service's log (at debug level) and the gateway's (every plugin line at info, the
// lowest it logs at) are searched for each key. The service log must also hold the
// reset's audit line (so the search is not over an empty log), and admin error replies
// must not echo a key either. Secrets likewise: neither the service's command line (ps)
// nor either log shows the sync secret or the admin token.
func TestLogsNameNoCallerKey(t *testing.T) {
	t.Parallel()
	e := sharedEnv(t)
	svc, err := harness.StartService(e.serviceConfig(append([]string{"--log-level", "debug"}, sharedServiceArgs...)...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Stop)
	rules := `{"rules":[
		{"id":"priv","match":{"prefix":"/p"},"limit":3,"window":"1m"},
		{"id":"priv-strict","match":{"prefix":"/strict"},"limit":2,"window":"1m","strict":true}]}`
	gws := e.fleetOn(t, harness.Wazero, []string{svc.Addr()}, uniqueKey("privacy"), 1, rules, true, harness.Sync{})
	g := gws[0]
	keys := []string{uniqueKey("sk_live_SECRETA"), uniqueKey("sk_live_SECRETB}brace"), uniqueKey("tok_SECRETC")}

	ctx := ctxFor(t, time.Minute)
	var wg sync.WaitGroup
	for _, key := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 8; i++ {
				for _, path := range []string{"/p/items", "/strict/pay"} {
					if a := e.client.Get(ctx, g.URL, path, key); a.Err != nil {
						t.Errorf("%s: %v", path, a.Err)
					}
				}
			}
		}()
	}
	wg.Wait()
	limited := 0
	for _, key := range keys {
		if a := e.client.Get(ctx, g.URL, "/p/items", key); a.Status == http.StatusTooManyRequests {
			limited++
		}
	}
	if limited != len(keys) {
		t.Errorf("%d of %d keys limited after 8 requests on a limit of 3: the traffic did not reach the rules", limited, len(keys))
	}

	admin := harness.Admin{Base: svc.URL(), Token: adminToken}
	var replies [][]byte
	for _, key := range keys {
		if _, err := admin.Usage(key); err != nil {
			t.Errorf("usage: %v", err)
		}
		for _, call := range []struct{ method, path string }{
			{http.MethodPost, "/v1/reset/" + url.PathEscape(key)},
			{http.MethodGet, "/v1/usage/" + url.PathEscape(key+strings.Repeat("x", 64<<10))}, // oversized
			{http.MethodPost, "/v1/usage/" + url.PathEscape(key)},                            // wrong method
			{http.MethodPut, "/v1/lists/deny?key=" + url.QueryEscape(key)},                   // no body
		} {
			req, err := http.NewRequestWithContext(ctx, call.method, svc.URL()+call.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+adminToken)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", call.method, call.path[:min(len(call.path), 40)], err)
			}
			var body bytes.Buffer
			_, _ = body.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode >= 400 {
				replies = append(replies, body.Bytes())
			}
		}
	}
	time.Sleep(500 * time.Millisecond) // the last syncs and their log lines

	svcLog, err := os.ReadFile(svc.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(svcLog, []byte(`"key_hash"`)) {
		t.Errorf("the service log has no reset audit line (key_hash): %d bytes searched", len(svcLog))
	}
	var gwLog bytes.Buffer
	for _, l := range g.Host().Logs() {
		gwLog.WriteString(l.String() + "\n")
	}
	for _, key := range keys {
		// The key itself, and its distinctive middle alone (a log could escape or cut it).
		for _, needle := range []string{key, key[:strings.Index(key, "SECRET")+7]} {
			if bytes.Contains(svcLog, []byte(needle)) {
				t.Errorf("the service log names caller key %q: %s", needle, lineWith(svcLog, needle))
			}
			if bytes.Contains(gwLog.Bytes(), []byte(needle)) {
				t.Errorf("the gateway log names caller key %q: %s", needle, lineWith(gwLog.Bytes(), needle))
			}
			for _, r := range replies {
				if bytes.Contains(r, []byte(needle)) {
					t.Errorf("an admin error reply echoes caller key %q: %.200s", needle, r)
				}
			}
		}
	}
	t.Logf("searched %d bytes of service log, %d bytes of gateway log, %d admin error replies for %d keys", len(svcLog), gwLog.Len(), len(replies), len(keys))

	// Nor does anything show a secret: the service reads them from files, so its command
	// line (what every local user sees in ps) holds none, and no log prints one.
	pid := strconv.Itoa(svc.Pid())
	cmdline, err := os.ReadFile("/proc/" + pid + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	ps, err := exec.Command("ps", "-ww", "-o", "args=", "-p", pid).Output()
	if err != nil {
		t.Fatalf("ps: %v", err)
	}
	if !bytes.Contains(ps, []byte("--sync-secret-file")) {
		t.Fatalf("ps shows %q: not the service's command line with its secret files", ps)
	}
	for what, text := range map[string][]byte{"/proc/<pid>/cmdline": cmdline, "ps": ps, "the service log": svcLog, "the gateway log": gwLog.Bytes()} {
		for name, secret := range map[string]string{"sync secret": syncSecret, "admin token": adminToken} {
			if bytes.Contains(text, []byte(secret)) {
				t.Errorf("%s shows the %s", what, name)
			}
		}
	}
}

// lineWith returns the first line of log containing needle, cut to 300 bytes.
func lineWith(log []byte, needle string) string {
	for _, l := range bytes.Split(log, []byte("\n")) {
		if bytes.Contains(l, []byte(needle)) {
			return string(l[:min(len(l), 300)])
		}
	}
	return ""
}

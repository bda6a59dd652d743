package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TestSecretsFromFiles runs the built binary with every secret in a file (Redis with a
// password): the process list and the log show none of them, the files' values are the
// ones in force, and SIGHUP swaps them without a restart — while a file that vanished or
// was emptied keeps the previous value and is counted as an error.
func TestSecretsFromFiles(t *testing.T) {
	const (
		syncOld, syncNew   = "sync-file-secret-1", "sync-file-secret-2"
		adminTok           = "admin-file-token-1"
		redisOld, redisNew = "redis-file-pass-1", "redis-file-pass-2"
	)
	secretsEver := []string{syncOld, syncNew, adminTok, redisOld, redisNew}

	srv := redistest.StartStandalone(t)
	ctx := context.Background()
	root := redis.NewClient(&redis.Options{Addr: srv.Addr(), Protocol: 2, DisableIdentity: true})
	if err := root.ConfigSet(ctx, "requirepass", redisOld).Err(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: redisOld, Protocol: 2, DisableIdentity: true})
	defer rdb.Close()
	_ = root.Close()

	dir := t.TempDir()
	bin := filepath.Join(dir, "tollgate-ratelimit")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	syncFile := writeFile(t, dir, "sync", syncOld+"\n")
	adminFile := writeFile(t, dir, "admin", adminTok+"\n")
	redisFile := writeFile(t, dir, "redis", redisOld+"\n")

	cmd := exec.Command(bin, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--redis-addrs", srv.Addr(),
		"--sync-secret-file", syncFile, "--admin-token-file", adminFile, "--log-format", "json")
	// The Redis password file through the environment form.
	cmd.Env = append(os.Environ(), "TOLLGATE_REDIS_PASSWORD_FILE="+redisFile)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	addrs := make(chan listening, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			_, _ = logs.Write(append(sc.Bytes(), '\n'))
			var rec struct{ Msg, Addr, Admin_addr string }
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "serving" {
				addrs <- listening{sync: rec.Addr, admin: rec.Admin_addr}
			}
		}
	}()
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
	var l listening
	select {
	case l = <-addrs:
	case <-time.After(20 * time.Second):
		t.Fatalf("no serving line: %s", logs)
	}

	// What other local users see of the process.
	cmdline, err := os.ReadFile("/proc/" + itoa(cmd.Process.Pid) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	ps, err := exec.Command("ps", "-ww", "-o", "args=", "-p", itoa(cmd.Process.Pid)).Output()
	if err != nil {
		t.Fatalf("ps: %v", err)
	}
	if !strings.Contains(string(ps), "--sync-secret-file") {
		t.Fatalf("ps shows %q: not the service's command line", ps)
	}

	syncBody, err := wire.AppendBatch(nil, &wire.Batch{Node: "gw-files", Seq: uint64(time.Now().UnixMicro())})
	if err != nil {
		t.Fatal(err)
	}
	syncWith := func(secret string) int {
		return statusBody(t, "POST", "http://"+l.sync+"/v1/sync", secret, syncBody)
	}
	reloadErrors := func() string {
		return metric(t, "http://"+l.admin, `tollgate_secret_reloads_total{outcome="error",secret="sync"}`)
	}
	hup := func() {
		t.Helper()
		if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	eventually := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(5 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s: not within 5 s; log:\n%s", what, logs)
			}
		}
	}

	steps := []struct {
		name string
		do   func()
		ok   func() bool
	}{
		{"values from the files in force", func() {}, func() bool {
			return syncWith(syncOld) == 200 && syncWith("") == 401 &&
				statusBody(t, "GET", "http://"+l.admin+"/v1/rules/versions", adminTok, nil) == 200 &&
				statusBody(t, "GET", "http://"+l.sync+"/readyz", "", nil) == 200
		}},
		{"SIGHUP with a new sync secret", func() { writeFile(t, dir, "sync", syncNew+"\n"); hup() }, func() bool {
			return syncWith(syncNew) == 200 && syncWith(syncOld) == 401
		}},
		{"SIGHUP with the sync secret file emptied keeps the last one", func() { writeFile(t, dir, "sync", "\n"); hup() }, func() bool {
			return reloadErrors() == "1" && syncWith(syncNew) == 200
		}},
		{"SIGHUP with the sync secret file gone keeps the last one", func() { _ = os.Remove(syncFile); hup() }, func() bool {
			return reloadErrors() == "2" && syncWith(syncNew) == 200
		}},
		{"SIGHUP with a new Redis password: new connections use it", func() {
			if err := rdb.ConfigSet(ctx, "requirepass", redisNew).Err(); err != nil {
				t.Fatal(err)
			}
			writeFile(t, dir, "redis", redisNew+"\n")
			hup()
			time.Sleep(100 * time.Millisecond)
			// Drop the service's authenticated connections: only the new password
			// gets new ones.
			if err := rdb.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
				t.Fatal(err)
			}
		}, func() bool { return statusBody(t, "GET", "http://"+l.sync+"/readyz", "", nil) == 200 }},
	}
	for _, s := range steps {
		s.do()
		eventually(s.name, s.ok)
	}

	// Nothing a local user or a log reader sees holds a secret.
	seen := map[string]string{"/proc/<pid>/cmdline": string(cmdline), "ps": string(ps), "log": logs.String()}
	for where, text := range seen {
		for _, s := range secretsEver {
			if strings.Contains(text, s) {
				t.Errorf("%s shows the secret %q", where, s)
			}
		}
	}
	if !strings.Contains(logs.String(), "secret reload failed") {
		t.Errorf("log lacks the failed reload: %s", logs)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func statusBody(t testing.TB, method, url, token string, body []byte) int {
	t.Helper()
	var r io.Reader
	if body != nil {
		r = strings.NewReader(string(body))
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

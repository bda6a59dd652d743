package wazerohost

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The probe guest (testdata/probe) is built once per test binary.
var probe struct {
	once sync.Once
	wasm []byte
	err  error
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "go" // let exec report the missing toolchain
}

func probeWasm(t testing.TB) []byte {
	t.Helper()
	probe.once.Do(func() {
		dir, err := os.MkdirTemp("", "host-probe-")
		if err != nil {
			probe.err = err
			return
		}
		defer os.RemoveAll(dir)
		out := filepath.Join(dir, "probe.wasm")
		cmd := exec.Command(goTool(), "build", "-buildmode=c-shared", "-o", out, "./testdata/probe")
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		if b, err := cmd.CombinedOutput(); err != nil {
			probe.err = fmt.Errorf("build testdata/probe: %v\n%s", err, b)
			return
		}
		probe.wasm, probe.err = os.ReadFile(out)
	})
	if probe.err != nil {
		t.Fatal(probe.err)
	}
	return probe.wasm
}

// newHost starts a Host running the probe and closes it when the test ends.
func newHost(t testing.TB, cfg Config) *Host {
	t.Helper()
	cfg.Wasm = probeWasm(t)
	h, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return h
}

func get(path string) *Request {
	return &Request{Method: "GET", Path: path, Authority: "gw.test", RemoteAddr: "10.0.0.1:5555"}
}

// recordingUpstream answers 200 and remembers the requests it saw.
type recordingUpstream struct {
	mu   sync.Mutex
	reqs []*Request
}

func (u *recordingUpstream) serve(_ context.Context, r *Request) (*Response, error) {
	u.mu.Lock()
	u.reqs = append(u.reqs, r)
	u.mu.Unlock()
	return &Response{Status: 200, Header: []Pair{{"x-replace", "original"}, {"content-type", "text/plain"}}, Body: []byte("upstream body")}, nil
}

func (u *recordingUpstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.reqs)
}

func (u *recordingUpstream) last() *Request {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.reqs) == 0 {
		return nil
	}
	return u.reqs[len(u.reqs)-1]
}

// eventually polls cond until it holds or a generous deadline passes; the deadline is
// a hang guard, not a timing claim.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSharedDataCASAcrossWorkers(t *testing.T) {
	h := newHost(t, Config{Workers: 2})
	shared := func(worker int, q string) *Response {
		return h.HandleOn(worker, get("/shared?"+q))
	}
	var lastCas string
	steps := []struct {
		name       string
		worker     int
		query      func() string
		wantStatus string
		wantBody   string
	}{
		{"get missing key", 0, func() string { return "op=get&key=k" }, "1", ""},
		{"set new key with cas 0", 0, func() string { return "op=set&key=k&value=a&cas=0" }, "0", ""},
		{"other worker reads it", 1, func() string { return "op=get&key=k" }, "0", "a"},
		{"set with current cas", 1, func() string { return "op=set&key=k&value=b&cas=" + lastCas }, "0", ""},
		{"set with stale cas", 0, func() string { return "op=set&key=k&value=c&cas=" + lastCas }, "8", ""},
		{"value kept after mismatch", 0, func() string { return "op=get&key=k" }, "0", "b"},
		{"cas 0 overwrites unconditionally", 0, func() string { return "op=set&key=k&value=d&cas=0" }, "0", ""},
		{"new key ignores its cas", 1, func() string { return "op=set&key=fresh&value=x&cas=12345" }, "0", ""},
		{"fresh key readable", 0, func() string { return "op=get&key=fresh" }, "0", "x"},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			resp := shared(s.worker, s.query())
			if got := resp.Get("x-status"); got != s.wantStatus {
				t.Fatalf("status = %s, want %s (body %q)", got, s.wantStatus, resp.Body)
			}
			if s.wantBody != "" && string(resp.Body) != s.wantBody {
				t.Fatalf("value = %q, want %q", resp.Body, s.wantBody)
			}
			if c := resp.Get("x-cas"); c != "" && c != "0" {
				lastCas = c
			}
		})
	}
	if got := h.SharedDataKeys(); got != 2 {
		t.Errorf("SharedDataKeys = %d, want 2", got)
	}
	if got, want := h.SharedDataBytes(), len("k")+len("d")+len("fresh")+len("x"); got != want {
		t.Errorf("SharedDataBytes = %d, want %d", got, want)
	}
}

func TestMapPairsRoundTrip(t *testing.T) {
	h := newHost(t, Config{})
	req := get("/echo")
	req.Header = []Pair{
		{"X-Mixed-Case", "v1"},
		{"x-empty", ""},
		{"x-dup", "first"},
		{"x-dup", "second"},
		{"x-utf8", "grüße, 世界"},
		{"x-request-id", "fixed-id"},
	}
	resp := h.Handle(req)
	if resp.Status != 200 || resp.Get("x-pairs-status") != "0" {
		t.Fatalf("echo failed: %d %q", resp.Status, resp.Body)
	}
	wantBody := ":authority=gw.test\n:path=/echo\n:method=GET\n:scheme=http\n" +
		"x-mixed-case=v1\nx-empty=\nx-dup=first\nx-dup=second\nx-utf8=grüße, 世界\nx-request-id=fixed-id\nx-forwarded-proto=http\n"
	if string(resp.Body) != wantBody {
		t.Errorf("headers the filter read:\n%s\nwant:\n%s", resp.Body, wantBody)
	}
	if got := resp.Values("echo-x-dup"); len(got) != 2 || got[0] != "first" || got[1] != "second" {
		t.Errorf("repeated header sent back = %q", got)
	}
	if got := resp.Get("echo-x-utf8"); got != "grüße, 世界" {
		t.Errorf("utf-8 value sent back = %q", got)
	}
	if got := resp.Get("x-num-headers"); got != "11" {
		t.Errorf("num_headers = %s, want 11", got)
	}
	if got := resp.Get("x-eos"); got != "1" {
		t.Errorf("end_of_stream = %s, want 1 for a request without body", got)
	}
}

func TestPairsCodec(t *testing.T) {
	tests := []struct {
		name  string
		pairs []Pair
	}{
		{"empty", nil},
		{"one", []Pair{{"a", "1"}}},
		{"spec example", []Pair{{"a", "1"}, {"b", "22"}}},
		{"empty strings", []Pair{{"", ""}, {"k", ""}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := DecodePairs(EncodePairs(tt.pairs))
			if !ok || len(got) != len(tt.pairs) {
				t.Fatalf("round trip = %v, %v", got, ok)
			}
			for i := range got {
				if got[i] != tt.pairs[i] {
					t.Fatalf("pair %d = %q, want %q", i, got[i], tt.pairs[i])
				}
			}
		})
	}
	spec := []byte{2, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 'a', 0, '1', 0, 'b', 0, '2', '2', 0}
	if !bytes.Equal(EncodePairs([]Pair{{"a", "1"}, {"b", "22"}}), spec) {
		t.Error("encoding differs from the spec's example")
	}
	for _, bad := range [][]byte{{5, 0, 0, 0}, {1, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 'a', 0}} {
		if _, ok := DecodePairs(bad); ok {
			t.Errorf("DecodePairs(%v) accepted a truncated map", bad)
		}
	}
}

func FuzzDecodePairs(f *testing.F) {
	f.Add(EncodePairs([]Pair{{"a", "1"}, {"b", "22"}}))
	f.Add([]byte{})
	f.Add([]byte{0})
	f.Add([]byte{255, 255, 255, 255})
	f.Add([]byte{1, 0, 0, 0, 255, 255, 255, 255, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		pairs, ok := DecodePairs(b)
		if !ok {
			return
		}
		again, ok := DecodePairs(EncodePairs(pairs))
		if !ok || len(again) != len(pairs) {
			t.Fatalf("re-encoding %v does not round trip", pairs)
		}
		for i := range pairs {
			if again[i] != pairs[i] {
				t.Fatalf("pair %d changed: %q -> %q", i, pairs[i], again[i])
			}
		}
	})
}

func TestLocalReply(t *testing.T) {
	up := &recordingUpstream{}
	h := newHost(t, Config{Upstream: up.serve})
	tests := []struct {
		path        string
		status      int
		body        string
		contentType string
		length      string
		extra       Pair
	}{
		{"/local", 429, "slow down", "text/plain", "9", Pair{"retry-after", "7"}},
		{"/local-json", 429, `{"error":"slow"}`, "application/json", "16", Pair{"content-type", "application/json"}},
		{"/local-empty", 204, "", "", "", Pair{"x-added", "yes"}},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			resp := h.Handle(get(tt.path))
			if resp.Status != tt.status || string(resp.Body) != tt.body || !resp.Local || resp.Details != "probe" {
				t.Fatalf("got %d %q local=%v details=%q", resp.Status, resp.Body, resp.Local, resp.Details)
			}
			if got := resp.Get("content-type"); got != tt.contentType {
				t.Errorf("content-type = %q, want %q", got, tt.contentType)
			}
			if got := resp.Get("content-length"); got != tt.length {
				t.Errorf("content-length = %q, want %q", got, tt.length)
			}
			if got := resp.Get(tt.extra[0]); got != tt.extra[1] {
				t.Errorf("%s = %q, want %q", tt.extra[0], got, tt.extra[1])
			}
			// Envoy passes a local reply through the encoder filters, the sender included.
			if resp.Get("x-added") != "yes" {
				t.Error("proxy_on_response_headers did not run for the local reply")
			}
		})
	}
	if n := up.count(); n != 0 {
		t.Errorf("upstream called %d times for local replies", n)
	}
}

func TestRequestAndResponseHeaders(t *testing.T) {
	up := &recordingUpstream{}
	h := newHost(t, Config{Upstream: up.serve})
	req := get("/pass?x=1")
	req.Header = []Pair{{"x-replace-me", "before"}}
	resp := h.Handle(req)
	if resp.Status != 200 || string(resp.Body) != "upstream body" || resp.Local {
		t.Fatalf("got %d %q local=%v", resp.Status, resp.Body, resp.Local)
	}
	seen := up.last()
	if seen.Path != "/pass?x=1" || seen.Get("x-probe") != "1" || seen.Get("x-replace-me") != "done" {
		t.Errorf("upstream saw path %q x-probe=%q x-replace-me=%q", seen.Path, seen.Get("x-probe"), seen.Get("x-replace-me"))
	}
	checks := []Pair{
		{"x-added", "yes"},
		{"x-replace", "replaced"},
		// Envoy drops access to the request headers once the request continued.
		{"x-req-headers-status", strconv.Itoa(int(StatusBadArgument))},
		{"x-resp-eos", "0"},
	}
	for _, c := range checks {
		if got := resp.Get(c[0]); got != c[1] {
			t.Errorf("%s = %q, want %q", c[0], got, c[1])
		}
	}
	if got := resp.Values("x-replace"); len(got) != 1 {
		t.Errorf("replace left %d values", len(got))
	}

	t.Run("local reply from the response phase", func(t *testing.T) {
		resp := h.Handle(get("/resp-local"))
		if resp.Status != 503 || string(resp.Body) != "replaced by filter" || resp.Get("x-resp-local") != "yes" {
			t.Fatalf("got %d %q", resp.Status, resp.Body)
		}
	})
}

func TestTicks(t *testing.T) {
	h := newHost(t, Config{Workers: 2, PluginConfig: []byte("tick=10")})
	if got := h.TickPeriod(1); got != 10*time.Millisecond {
		t.Fatalf("tick period = %v", got)
	}
	eventually(t, "ticks on both workers", func() bool { return h.Metrics()["probe.ticks"] >= 6 })
	if h.Stats().Ticks < 6 {
		t.Errorf("host counted %d ticks", h.Stats().Ticks)
	}
}

// calloutServer answers /ok with "pong", hangs on /slow until the caller gives up and
// returns 500 on anything else.
func calloutServer(t *testing.T) (*httptest.Server, *atomic.Value) {
	var last atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		last.Store(fmt.Sprintf("%s %s host=%s from=%s body=%s", r.Method, r.URL.Path, r.Host, r.Header.Get("x-from"), body))
		switch r.URL.Path {
		case "/ok":
			w.Header().Set("x-upstream", "1")
			_, _ = io.WriteString(w, "pong")
		case "/slow":
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		default:
			w.WriteHeader(500)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &last
}

func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestHTTPCall(t *testing.T) {
	srv, last := calloutServer(t)
	clusters := map[string][]string{
		"svc":  {strings.TrimPrefix(srv.URL, "http://")},
		"dead": {closedPort(t)},
	}
	envoy := newHost(t, Config{Clusters: clusters})
	reset := newHost(t, Config{Clusters: clusters, CalloutFailuresAsReset: true})
	tests := []struct {
		name   string
		h      *Host
		query  string
		status int
		want   []string
	}{
		{"success", envoy, "cluster=svc&path=/ok&timeout=5000", 200,
			[]string{"status=200 ", "body=pong", "status_st=0", "body_st=0", "code=0", "eff=0"}},
		{"timeout arrives as Envoy's 504", envoy, "cluster=svc&path=/slow&timeout=50", 200,
			[]string{"status=504 ", "headers=3 ", "body=upstream request timeout"}},
		{"connect failure arrives as Envoy's 503", envoy, "cluster=dead&path=/ok&timeout=2000", 200,
			[]string{"status=503 ", "body=upstream connect error or disconnect/reset before headers. reset reason: connection failure"}},
		{"timeout as reset", reset, "cluster=svc&path=/slow&timeout=50", 200,
			[]string{"status= ", "headers=0 ", "body= ", "trailers=0", "status_st=2", "body_st=1", "code=11", "msg=reset", "pairs=0"}},
		{"unknown cluster", envoy, "cluster=nope&path=/ok", 500, []string{"http_call status=2"}},
		{"missing :path", envoy, "cluster=svc&nopath=1", 500, []string{"http_call status=2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := tt.h.Handle(get("/callout?" + tt.query))
			if resp.Status != tt.status {
				t.Fatalf("status %d, body %q", resp.Status, resp.Body)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(resp.Body)+" ", w) {
					t.Errorf("body %q lacks %q", resp.Body, w)
				}
			}
		})
	}
	if got, _ := last.Load().(string); !strings.HasPrefix(got, "POST /") || !strings.Contains(got, "host=callout.test from=probe body=ping") {
		t.Errorf("callout server saw %q", got)
	}
	if envoy.Stats().Callouts != 3 || envoy.Stats().CalloutFailures != 2 {
		t.Errorf("stats: %+v", envoy.Stats())
	}
}

func TestPauseAndResume(t *testing.T) {
	srv, _ := calloutServer(t)
	up := &recordingUpstream{}
	h := newHost(t, Config{
		Workers:           2,
		Upstream:          up.serve,
		Clusters:          map[string][]string{"svc": {strings.TrimPrefix(srv.URL, "http://")}},
		StreamIdleTimeout: time.Minute,
	})

	t.Run("callout resumes the request", func(t *testing.T) {
		resp := h.HandleOn(1, get("/callout?cluster=svc&path=/ok&timeout=5000&mode=resume"))
		if resp.Status != 200 || resp.Local {
			t.Fatalf("got %d %q local=%v", resp.Status, resp.Body, resp.Local)
		}
		if got := up.last().Get("x-callout"); !strings.Contains(got, "status=200") || !strings.Contains(got, "eff=0") {
			t.Errorf("upstream saw x-callout %q", got)
		}
	})
	t.Run("paused too long gets the idle timeout reply", func(t *testing.T) {
		impatient := newHost(t, Config{StreamIdleTimeout: 50 * time.Millisecond})
		resp := impatient.Handle(get("/pause"))
		if resp.Status != 408 || string(resp.Body) != "stream timeout" || resp.Details != "stream_idle_timeout" {
			t.Fatalf("got %d %q %q", resp.Status, resp.Body, resp.Details)
		}
		if resp.Get("x-added") != "yes" {
			t.Error("the timeout reply skipped proxy_on_response_headers")
		}
	})
	t.Run("client gone while paused resets the stream", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if resp := h.Serve(ctx, 0, get("/pause")); !resp.Reset {
			t.Fatalf("got %+v", resp)
		}
	})
	t.Run("proxy_close_stream resets", func(t *testing.T) {
		if resp := h.Handle(get("/close")); !resp.Reset {
			t.Fatalf("got %+v", resp)
		}
	})
	if n := up.count(); n != 1 {
		t.Errorf("upstream called %d times, want 1", n)
	}
}

func TestMetrics(t *testing.T) {
	h := newHost(t, Config{Workers: 2})
	r0 := h.HandleOn(0, get("/metrics"))
	want := map[string]string{
		"x-inc":      "0",
		"x-neg":      strconv.Itoa(int(StatusBadArgument)), // counters only go up
		"x-counter":  "1",
		"x-get":      "0",
		"x-hist-get": strconv.Itoa(int(StatusBadArgument)), // histograms cannot be read
		"x-unknown":  strconv.Itoa(int(StatusNotFound)),
	}
	for k, v := range want {
		if got := r0.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	h.HandleOn(1, get("/metrics"))
	m := h.Metrics()
	if m["probe.requests"] != 2 || m["probe.gauge"] != 40 || m["probe.latency"] != 7 {
		t.Errorf("metrics aggregated over workers = %v", m)
	}
	var buf bytes.Buffer
	if err := h.WritePrometheus(&buf); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"# TYPE probe_requests counter\nprobe_requests 2\n",
		"# TYPE probe_gauge gauge\nprobe_gauge 40\n",
		"# TYPE probe_latency histogram\n",
		"probe_latency_bucket{le=\"5\"} 0\n",
		"probe_latency_bucket{le=\"10\"} 2\n",
		"probe_latency_count 2\n",
		"probe_latency_sum 14\n",
		// Per-rule stats: one series per rule of one metric, the tag cut from the name.
		"# TYPE probe_rule_hits counter\nprobe_rule_hits{rule=\"api\"} 6\nprobe_rule_hits{rule=\"web\"} 2\n",
		"wasmhost_requests_total 2\n",
	} {
		if !strings.Contains(buf.String(), line) {
			t.Errorf("Prometheus output lacks %q:\n%s", line, buf.String())
		}
	}
}

// TestStatsTags: stats tags follow Envoy's convention (the first group is cut from the
// name, the second is the value), applied in order; a regex without two groups is refused.
func TestStatsTags(t *testing.T) {
	tags, err := compileTags([]StatsTag{DefaultStatsTags[0], {Name: "shard", Regex: `^tollgate\.shard\.((\d+)\.)`}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		stat, name string
		tags       map[string]string
	}{
		{"rule=.=api;.;tollgate.rule.allowed", "tollgate.rule.allowed", map[string]string{"rule": "api"}},
		{"wasmcustom.rule=.=a.b-c;.;tollgate.rule.limited", "wasmcustom.tollgate.rule.limited", map[string]string{"rule": "a.b-c"}},
		{"tollgate.shard.3.errors", "tollgate.shard.errors", map[string]string{"shard": "3"}},
		{"tollgate.requests_allowed", "tollgate.requests_allowed", nil},
	}
	for _, tt := range tests {
		t.Run(tt.stat, func(t *testing.T) {
			name, got := extractTags(tags, tt.stat)
			if name != tt.name || !maps.Equal(got, tt.tags) {
				t.Fatalf("extractTags(%q) = %q %v, want %q %v", tt.stat, name, got, tt.name, tt.tags)
			}
		})
	}
	if _, err := compileTags([]StatsTag{{Name: "x", Regex: `(one)`}}); err == nil {
		t.Fatal("a regex with one group was accepted")
	}
}

// TestAccessEntry: a finished stream hands its status and the properties the plugin set
// (as Envoy's filter state, "wasm." + path) to OnStreamDone.
func TestAccessEntry(t *testing.T) {
	var mu sync.Mutex
	var got []AccessEntry
	h := newHost(t, Config{Workers: 1, OnStreamDone: func(e AccessEntry) {
		mu.Lock()
		got = append(got, e)
		mu.Unlock()
	}})
	r := h.Handle(get("/setprop?path=tollgate&value=decision:limited"))
	if r.Get("x-status") != "0" {
		t.Fatalf("proxy_set_property: status %q", r.Get("x-status"))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0].Status != 200 || got[0].FilterState["wasm.tollgate"] != "decision:limited" {
		t.Fatalf("access entries %+v", got)
	}
}

func TestPrometheusName(t *testing.T) {
	tests := []struct{ in, want string }{
		{"tollgate.decisions", "tollgate_decisions"},
		{"a-b c/d", "a_b_c_d"},
		{"9lives", "_9lives"},
		{"ok_name:sub", "ok_name:sub"},
		{"", "_"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := PrometheusName(tt.in); got != tt.want {
				t.Errorf("PrometheusName(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestStreamLifecycleOrder(t *testing.T) {
	up := &recordingUpstream{}
	h := newHost(t, Config{Upstream: up.serve})
	resp := h.Handle(get("/pass"))
	if resp.Status != 200 {
		t.Fatalf("status %d", resp.Status)
	}
	var seq []string
	for _, e := range h.Logs() {
		for _, p := range []string{"on_log ", "on_done ", "on_delete "} {
			if strings.HasPrefix(e.Message, p) && !strings.Contains(e.Message, "root") {
				seq = append(seq, e.Message)
			}
		}
	}
	want := []string{"on_log 2 path=/pass st=0 status=200", "on_done 2", "on_delete 2"}
	if strings.Join(seq, "|") != strings.Join(want, "|") {
		t.Fatalf("stream callbacks = %q, want %q", seq, want)
	}
}

func TestConfigRefused(t *testing.T) {
	_, err := New(Config{Wasm: probeWasm(t), PluginConfig: []byte("refuse")})
	if err == nil {
		t.Fatal("New accepted a configuration the plugin refused")
	}
	for _, want := range []string{"proxy_on_configure", "refusing configuration", `"refuse"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestReconfigure(t *testing.T) {
	h := newHost(t, Config{Workers: 2, PluginConfig: []byte("v1")})
	config := func(w int) (string, string) {
		r := h.HandleOn(w, get("/config"))
		return string(r.Body), r.Get("x-root")
	}
	if body, root := config(0); body != "v1" || root != "1" {
		t.Fatalf("before: %q root %s", body, root)
	}
	if err := h.Reconfigure([]byte("v2")); err != nil {
		t.Fatal(err)
	}
	for w := 0; w < 2; w++ {
		body, root := config(w)
		if body != "v2" || root == "1" {
			t.Errorf("worker %d after reconfigure: %q root %s", w, body, root)
		}
	}
	err := h.Reconfigure([]byte("v3,refuse"))
	if err == nil || !strings.Contains(err.Error(), "refusing configuration") {
		t.Fatalf("refused reconfigure returned %v", err)
	}
	if body, _ := config(1); body != "v2" {
		t.Errorf("a refused configuration changed the plugin: %q", body)
	}
	eventually(t, "old root contexts deleted on both workers", func() bool {
		n := 0
		for _, e := range h.Logs() {
			if e.Message == "on_delete 1" {
				n++
			}
		}
		return n == 2
	})
}

func TestProperties(t *testing.T) {
	h := newHost(t, Config{RootID: "tollgate", NodeID: "gw-a"})
	req := get("/props")
	req.RemoteAddr = "192.0.2.7:41000"
	req.LocalAddr = "127.0.0.1:8080"
	resp := h.Handle(req)
	want := "source.address=192.0.2.7:41000 (0)\n" +
		"plugin_root_id=tollgate (0)\n" +
		"node.id=gw-a (0)\n" +
		"destination.address=127.0.0.1:8080 (0)\n" +
		"request.path=/props (0)\n" +
		"missing.thing= (1)\n" +
		"source.port=41000\n"
	if string(resp.Body) != want {
		t.Fatalf("properties:\n%s\nwant:\n%s", resp.Body, want)
	}
}

func TestVMFailure(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("fail_open=%v", failOpen), func(t *testing.T) {
			up := &recordingUpstream{}
			h := newHost(t, Config{Workers: 2, Upstream: up.serve, FailOpen: failOpen, LogLevel: LogCritical})
			first := h.HandleOn(0, get("/trap"))
			after := h.HandleOn(0, get("/pass"))
			// The request whose callback killed the VM gets 503 under either policy, as
			// in Envoy; fail-open lets the later ones through.
			if first.Status != 503 || first.Details != "wasm_fail_stream" {
				t.Errorf("the request that killed the VM got %d %q", first.Status, first.Details)
			}
			for _, resp := range []*Response{after} {
				if failOpen && resp.Status != 200 {
					t.Errorf("fail-open request got %d", resp.Status)
				}
				if !failOpen && (resp.Status != 503 || resp.Details != "wasm_fail_stream") {
					t.Errorf("fail-closed request got %d %q", resp.Status, resp.Details)
				}
			}
			if h.Failed(0) == nil || h.Failed(1) != nil {
				t.Errorf("failed: worker0=%v worker1=%v", h.Failed(0), h.Failed(1))
			}
			if r := h.HandleOn(1, get("/pass")); r.Status != 200 || r.Get("x-added") != "yes" {
				t.Errorf("healthy worker answered %d", r.Status)
			}
		})
	}
}

func TestCloseWaitsForProxyDone(t *testing.T) {
	flushed := make(chan string, 1)
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case flushed <- r.URL.Path:
		default:
		}
	}))
	defer sink.Close()
	h, err := New(Config{
		Wasm:         probeWasm(t),
		PluginConfig: []byte("slowdone"),
		Clusters:     map[string][]string{"sink": {strings.TrimPrefix(sink.URL, "http://")}},
		DrainTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-flushed:
		if p != "/flush" {
			t.Errorf("sink got %q", p)
		}
	default:
		t.Fatal("the root's final callout never reached the sink")
	}
	var seq []string
	for _, e := range h.Logs() {
		if strings.Contains(e.Message, "root 1") || strings.Contains(e.Message, "proxy_done") {
			seq = append(seq, e.Message)
		}
	}
	joined := strings.Join(seq, "|")
	iDone := strings.Index(joined, "flush answered; proxy_done status 0")
	iDel := strings.Index(joined, "on_delete root 1")
	if iDone < 0 || iDel < 0 || iDone > iDel {
		t.Fatalf("shutdown sequence %q: want proxy_done (OK) before proxy_on_delete", seq)
	}
}

func TestExchange(t *testing.T) {
	h := newHost(t, Config{})
	upstream := &Response{Status: 201, Header: []Pair{{"x-replace", "a"}}, Body: []byte("ok")}
	resp, err := h.Exchange(0, get("/pass"), upstream)
	if err != nil || resp.Status != 201 || resp.Get("x-replace") != "replaced" {
		t.Fatalf("Exchange = %+v, %v", resp, err)
	}
	resp, err = h.Exchange(0, get("/pause"), upstream)
	if !errors.Is(err, errPaused) || !resp.Reset {
		t.Fatalf("paused Exchange = %+v, %v", resp, err)
	}
}

func TestRejectsModuleWithoutABIVersion(t *testing.T) {
	// The smallest valid module: magic and version only.
	_, err := New(Config{Wasm: []byte{0, 'a', 's', 'm', 1, 0, 0, 0}})
	if err == nil || !strings.Contains(err.Error(), "proxy_abi_version") {
		t.Fatalf("New = %v, want an ABI version error", err)
	}
}

func BenchmarkExchange(b *testing.B) {
	h := newHost(b, Config{})
	req := get("/pass")
	req.Header = []Pair{{"x-api-key", "sk_test_123"}, {"user-agent", "bench"}}
	upstream := &Response{Status: 200, Header: []Pair{{"content-type", "text/plain"}}}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := h.Exchange(0, req, upstream); err != nil {
			b.Fatal(err)
		}
	}
}

func TestCloseResetsPausedRequests(t *testing.T) {
	h, err := New(Config{Wasm: probeWasm(t), DrainTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan *Response, 1)
	go func() { done <- h.Handle(get("/pause")) }()
	eventually(t, "the request to pause", func() bool { return h.Stats().Paused == 1 })
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if resp := <-done; !resp.Reset {
		t.Fatalf("paused request after Close = %+v, want a reset", resp)
	}
	var seq []string
	for _, e := range h.Logs() {
		if e.Worker == 0 && (strings.HasPrefix(e.Message, "on_") || strings.Contains(e.Message, "root 1")) {
			seq = append(seq, e.Message)
		}
	}
	want := "context_create root 1|configured root 1 with \"\"|on_log 2 path=/pause st=0 status=|on_done 2|on_delete 2|on_done root 1|on_delete root 1"
	if got := strings.Join(seq, "|"); got != want {
		t.Fatalf("shutdown sequence:\n%s\nwant:\n%s", got, want)
	}
	if resp := h.Handle(get("/pass")); resp.Status != 503 || resp.Details != "host_closed" {
		t.Errorf("request after Close = %d %q", resp.Status, resp.Details)
	}
}

func TestClock(t *testing.T) {
	at := time.Date(2021, 12, 20, 12, 0, 0, 0, time.UTC)
	h := newHost(t, Config{Clock: func() time.Time { return at }})
	resp := h.Handle(get("/time"))
	want := strconv.FormatInt(at.UnixNano(), 10)
	if resp.Get("x-host-ns") != want || resp.Get("x-wasi-ns") != want {
		t.Fatalf("module read host=%s wasi=%s, want %s", resp.Get("x-host-ns"), resp.Get("x-wasi-ns"), want)
	}
}

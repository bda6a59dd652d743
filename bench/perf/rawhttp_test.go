package perf

import (
	"bufio"
	"io"
	"math"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestRawConn drives the load generator's client against RawBackend and against a
// net/http server that answers in every framing the client must read: a length, chunks,
// and a connection close.
func TestRawConn(t *testing.T) {
	addr, stop, err := RawBackend()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	c, err := dialRaw(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i, req := range compareRequests(3) {
		status, err := c.do(req, time.Now().Add(2*time.Second))
		if err != nil || status != 200 {
			t.Fatalf("request %d to RawBackend: status %d, %v", i, status, err)
		}
	}

	srv, stopHTTP, err := serveForTest(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("q") {
		case "chunked":
			w.WriteHeader(429)
			f := w.(http.Flusher)
			_, _ = io.WriteString(w, "first")
			f.Flush()
			_, _ = io.WriteString(w, "second")
		case "close":
			w.Header().Set("Connection", "close")
			w.WriteHeader(503)
			_, _ = io.WriteString(w, "bye")
		default:
			_, _ = io.WriteString(w, "ok\n")
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer stopHTTP()
	hc, err := dialRaw(srv)
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	for _, tc := range []struct {
		q       string
		status  int
		closing bool
	}{{"length", 200, false}, {"chunked", 429, false}, {"length", 200, false}, {"close", 503, true}} {
		status, err := hc.do([]byte("GET /?q="+tc.q+" HTTP/1.1\r\nHost: x\r\n\r\n"), time.Now().Add(2*time.Second))
		if status != tc.status || (err != nil) != tc.closing {
			t.Fatalf("q=%s: status %d, err %v; want %d, closing %v", tc.q, status, err, tc.status, tc.closing)
		}
	}
}

func serveForTest(h http.Handler) (string, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	s := &http.Server{Handler: h}
	go func() { _ = s.Serve(l) }()
	return l.Addr().String(), func() { _ = s.Close() }, nil
}

// TestRawBackendBody: a request with a body is read whole, so the next one on the
// connection is parsed from its start.
func TestRawBackendBody(t *testing.T) {
	addr, stop, err := RawBackend()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(c)
	for i := 0; i < 2; i++ {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(b) != "ok\n" {
			t.Fatalf("answer %d: %d %q", i, resp.StatusCode, b)
		}
	}
}

func TestParseDSOReport(t *testing.T) {
	rep := "# Samples: 2K of event 'cpu-clock'\n#\n# Overhead  Shared Object\n# ........  .............\n#\n    57.09%  envoy\n    30.00%  [kernel.kallsyms]\n     2.50%  [unknown]\n\n#\n"
	got := parseDSOReport(rep)
	want := []DSOShare{{"envoy", 0.5709}, {"[kernel.kallsyms]", 0.30}, {"[unknown]", 0.025}}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if got[i].DSO != want[i].DSO || math.Abs(got[i].Share-want[i].Share) > 1e-9 {
			t.Errorf("%d: got %v, want %v", i, got[i], want[i])
		}
	}
}

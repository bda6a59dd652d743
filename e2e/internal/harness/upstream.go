package harness

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Upstream is the backend behind the gateways: it answers 200 with a short JSON body and
// counts what reached it, in all and per caller key (X-Api-Key), so a scenario can check
// that refused requests never did — by its own keys, while other scenarios run beside it.
type Upstream struct {
	URL      string
	requests atomic.Int64
	mu       sync.Mutex
	byKey    map[string]int64
	srv      *http.Server
	done     chan struct{}
}

// StartUpstream listens on a free loopback port.
func StartUpstream() (*Upstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("upstream listen: %w", err)
	}
	u := &Upstream{URL: "http://" + ln.Addr().String(), byKey: map[string]int64{}, done: make(chan struct{})}
	u.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u.requests.Add(1)
			if k := r.Header.Get("X-Api-Key"); k != "" {
				u.mu.Lock()
				u.byKey[k]++
				u.mu.Unlock()
			}
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, "{\"ok\":true,\"path\":%q}\n", r.URL.Path)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	go func() { defer close(u.done); _ = u.srv.Serve(ln) }()
	return u, nil
}

// Requests is how many requests reached the upstream.
func (u *Upstream) Requests() int64 { return u.requests.Load() }

// RequestsOf is how many requests of caller key (X-Api-Key) reached the upstream.
func (u *Upstream) RequestsOf(key string) int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.byKey[key]
}

// Close stops the server.
func (u *Upstream) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = u.srv.Shutdown(ctx)
	<-u.done
}

package perf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// front is a gateway's HTTP listener in front of a Host, as e2e/cmd/tollgate-gateway
// serves one: the request becomes a wazerohost.Request, runs through the filter chain on
// the worker its connection maps to, and the upstream is a real HTTP server. check, when
// set, is a per-request limiter asked first (429 when it refuses).
type front struct {
	h     *wazerohost.Host
	check func(ctx context.Context, key string) (bool, error)
}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.check != nil {
		ok, err := f.check(r.Context(), r.Header.Get("x-api-key"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if !ok {
			http.Error(w, "rate limited", http.StatusTooManyRequests)
			return
		}
	}
	req := &wazerohost.Request{Method: r.Method, Path: r.URL.RequestURI(), Authority: r.Host, Protocol: r.Proto, RemoteAddr: r.RemoteAddr}
	keys := make([]string, 0, len(r.Header))
	for k := range r.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		for _, v := range r.Header[k] {
			req.Header = append(req.Header, wazerohost.Pair{k, v})
		}
	}
	resp := f.h.Serve(r.Context(), f.h.PickWorker(r.RemoteAddr), req)
	if resp.Reset {
		panic(http.ErrAbortHandler)
	}
	for _, p := range resp.Header {
		if p[0] == "content-length" || p[0] == "connection" || p[0] == "transfer-encoding" || strings.HasPrefix(p[0], ":") {
			continue
		}
		w.Header().Add(p[0], p[1])
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// serve runs handler on a loopback listener until the returned stop is called.
func serve(handler http.Handler) (addr string, stop func(), err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Println("bench http server:", err)
		}
	}()
	return l.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}

// HTTPKind selects the limiter of an HTTP run.
type HTTPKind int

const (
	HTTPPassThrough HTTPKind = iota // the pass-through module, no limiter
	HTTPTollgate                    // the filter, synced
	HTTPRedisRate                   // redis_rate per request, then the pass-through module
	// HTTPFloor is the floor module (the unavoidable host calls of one decision, no
	// logic): what any filter making those calls costs on this host.
	HTTPFloor
)

// gatewayRig is a gateway front on a loopback listener with its upstream: what a load
// through real HTTP is sent to.
type gatewayRig struct {
	url  string           // the request URL on the front
	h    *wazerohost.Host // the gateway host
	name string           // the limiter, for the report
	stop []func()
}

func (g *gatewayRig) close() {
	for i := len(g.stop) - 1; i >= 0; i-- {
		g.stop[i]()
	}
}

// startGateway starts an upstream HTTP server that answers 200 with a small body and,
// in front of it, a gateway front (host on o.Workers VMs) running kind's limiter.
func (s *Stack) startGateway(o LoadOptions, kind HTTPKind, limit int) (_ *gatewayRig, err error) {
	g := &gatewayRig{}
	defer func() {
		if err != nil {
			g.close()
		}
	}()
	upAddr, stopUp, err := serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	if err != nil {
		return nil, err
	}
	g.stop = append(g.stop, stopUp)
	up, err := wazerohost.ProxyUpstream("http://" + upAddr)
	if err != nil {
		return nil, err
	}
	f := &front{}
	// plain is a gateway host running wasm with no limiter configuration.
	plain := func(wasm []byte) (*wazerohost.Host, error) {
		return wazerohost.New(wazerohost.Config{Wasm: wasm, Workers: o.Workers, Upstream: up, LogLevel: wazerohost.LogWarn})
	}
	switch kind {
	case HTTPTollgate:
		f.h, err = s.tollgateHost(o, "gcra", limit, true, up)
		g.name = "Tollgate (filter, 100 ms sync)"
	case HTTPRedisRate:
		f.h, err = plain(s.Empty)
		rdb := redis.NewClient(&redis.Options{Addr: s.Redis.Options().Addr, PoolSize: max(2*o.Concurrency, 20)})
		g.stop = append(g.stop, func() { rdb.Close() })
		lim := redis_rate.NewLimiter(rdb)
		rl := redis_rate.PerSecond(limit)
		f.check = func(ctx context.Context, key string) (bool, error) {
			r, err := lim.Allow(ctx, key, rl)
			if err != nil {
				return false, err
			}
			return r.Allowed > 0, nil
		}
		g.name = "per-request redis_rate (GCRA)"
	case HTTPFloor:
		if s.Floor == nil {
			return nil, fmt.Errorf("no floor module in the stack")
		}
		f.h, err = plain(s.Floor)
		g.name = "floor module (its host calls, no logic)"
	default:
		f.h, err = plain(s.Empty)
		g.name = "pass-through (no limiter)"
	}
	if err != nil {
		return nil, fmt.Errorf("gateway host: %w", err)
	}
	g.h = f.h
	g.stop = append(g.stop, func() { f.h.Close() })
	gwAddr, stopGw, err := serve(f)
	if err != nil {
		return nil, err
	}
	g.stop = append(g.stop, stopGw)
	g.url = "http://" + gwAddr + "/v1/search?q=tollgate"
	return g, nil
}

// get sends one request for key with client and reports whether it was admitted (200)
// or refused (429); any other answer is an error.
func (g *gatewayRig) get(ctx context.Context, client *http.Client, key string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.url, nil)
	if err != nil {
		return false, err
	}
	req.Host = "api.example.com"
	req.Header.Set("X-Api-Key", key)
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return false, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return true, nil
	case http.StatusTooManyRequests:
		return false, nil
	}
	return false, fmt.Errorf("status %d", resp.StatusCode)
}

// RunHTTP is the load through real HTTP: o.Concurrency client goroutines, each with
// its own keep-alive connection, send GET requests to a gateway front (host on
// o.Workers VMs), which forwards admitted requests over HTTP to an upstream that
// answers 200 with a small body. Everything runs in this process.
func (s *Stack) RunHTTP(o LoadOptions, kind HTTPKind, limit int) (LoadResult, error) {
	o = o.withDefaults()
	g, err := s.startGateway(o, kind, limit)
	if err != nil {
		return LoadResult{}, err
	}
	defer g.close()

	clients := make([]*http.Client, o.Concurrency)
	for i := range clients {
		clients[i] = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1, DisableCompression: true}}
	}
	defer func() {
		for _, c := range clients {
			c.CloseIdleConnections()
		}
	}()
	fn := func(ctx context.Context, gr, k int) (bool, error) {
		return g.get(ctx, clients[gr], o.KeyPrefix+"-"+strconv.Itoa(k))
	}
	var hm *wazerohost.Host
	if kind == HTTPTollgate {
		hm = g.h
	}
	res := s.measure(o, fn, hm)
	res.Name = g.name
	if kind == HTTPRedisRate {
		res.RoundTrips = res.Redis.Scripts()
	}
	return res, nil
}

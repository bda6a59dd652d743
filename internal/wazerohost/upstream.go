package wazerohost

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// maxUpstreamBody bounds a response body ProxyUpstream buffers.
const maxUpstreamBody = 64 << 20

// ProxyUpstream returns an Upstream that forwards requests over HTTP/1.1 to base
// ("http://127.0.0.1:9000" or with a path prefix), keeping the request's Host, as
// Envoy's router does without host rewriting. gRPC requests go over HTTP/2 cleartext
// (h2c), as gRPC requires, and the response's trailers come back in Response.Trailer.
func ProxyUpstream(base string) (Upstream, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, fmt.Errorf("upstream %q: %w", base, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("upstream %q: want http://host:port[/prefix]", base)
	}
	prefix := strings.TrimSuffix(u.Path, "/")
	client := &http.Client{
		Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        512,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
		},
		// The client sees the upstream's redirects, as behind Envoy.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	h2c := new(http.Protocols)
	h2c.SetUnencryptedHTTP2(true)
	grpcClient := &http.Client{Transport: &http.Transport{
		Proxy:           nil,
		DialContext:     (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		Protocols:       h2c,
		IdleConnTimeout: 90 * time.Second,
	}}
	return func(ctx context.Context, r *Request) (*Response, error) {
		target := u.Scheme + "://" + u.Host + prefix + r.Path
		req, err := http.NewRequestWithContext(ctx, r.Method, target, bytes.NewReader(r.Body))
		if err != nil {
			return nil, fmt.Errorf("upstream request %q: %w", target, err)
		}
		req.Host = r.Authority
		for _, p := range r.Header {
			if hopByHop[p[0]] || p[0] == "content-length" {
				continue
			}
			req.Header.Add(p[0], p[1])
		}
		c := client
		if IsGRPC(r.Get("content-type")) {
			c = grpcClient
		}
		resp, err := c.Do(req)
		if err != nil {
			return nil, fmt.Errorf("upstream %q: %w", target, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxUpstreamBody))
		if err != nil {
			return nil, fmt.Errorf("upstream %q: read body: %w", target, err)
		}
		out := &Response{Status: resp.StatusCode, Body: body, Trailer: headerPairs(resp.Trailer)}
		for _, p := range headerPairs(resp.Header) {
			if hopByHop[p[0]] {
				continue
			}
			out.Header = append(out.Header, p)
		}
		return out, nil
	}, nil
}

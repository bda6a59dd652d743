package wazerohost

import (
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
)

// hopByHopResponse headers are the connection's business, not the filter's.
var hopByHopResponse = map[string]bool{"connection": true, "keep-alive": true, "transfer-encoding": true, "content-length": true}

// HTTPFrontend returns the HTTP side of the gateway (serve it with Protocols, for gRPC
// clients): each request is read (body up to maxBody bytes, else 413), handed to a
// worker picked by the client's address (a
// connection stays on one worker, as in Envoy), run through the filter and the upstream,
// and written back; a reset stream drops the connection. The gateway binary, the e2e
// harness and the demo all serve through it.
func (h *Host) HTTPFrontend(maxBody int64) http.Handler {
	return frontend{h: h, maxBody: maxBody}
}

type frontend struct {
	h       *Host
	maxBody int64
}

func (f frontend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, f.maxBody+1))
	if err != nil {
		http.Error(w, "read request body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if int64(len(body)) > f.maxBody {
		http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
		return
	}
	req := &Request{
		Method:     r.Method,
		Path:       r.URL.RequestURI(),
		Authority:  r.Host,
		Protocol:   r.Proto,
		Body:       body,
		RemoteAddr: r.RemoteAddr,
	}
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		req.LocalAddr = la.String()
	}
	keys := make([]string, 0, len(r.Header))
	for k := range r.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		for _, v := range r.Header[k] {
			req.Header = append(req.Header, Pair{k, v})
		}
	}
	resp := f.h.Serve(r.Context(), f.h.PickWorker(r.RemoteAddr), req)
	if resp.Reset {
		panic(http.ErrAbortHandler) // Envoy resets the stream: the client sees the connection drop
	}
	for _, p := range resp.Header {
		if hopByHopResponse[p[0]] || strings.HasPrefix(p[0], ":") {
			continue
		}
		w.Header().Add(p[0], p[1])
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
	for _, p := range resp.Trailer {
		w.Header().Add(http.TrailerPrefix+p[0], p[1])
	}
}

// Protocols is what the gateway's listener speaks: HTTP/1.1 and HTTP/2 over cleartext
// (h2c with prior knowledge, what gRPC clients use without TLS), as an Envoy listener
// with the HTTP connection manager's codec_type AUTO does.
func Protocols() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return p
}

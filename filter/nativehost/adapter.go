package nativehost

import (
	"errors"
	"strings"

	"github.com/tollgate-rl/tollgate/filter/plugin"
)

// adapter is one worker's plugin.Host. A call applies to the worker's current context:
// the stream whose callback is running (or that SetEffectiveContext chose), else the
// root.
type adapter struct{ w *Worker }

var _ plugin.Host = adapter{}

// Errors the host answers with where Envoy answers a status.
var (
	errNoStream   = errors.New("nativehost: no stream context (BadArgument)")
	errNotFound   = errors.New("nativehost: not found")
	errBadContext = errors.New("nativehost: unknown context (BadArgument)")
)

func (a adapter) RequestHeaders() ([][2]string, error) {
	s := a.w.cur
	if s == nil {
		return nil, errNoStream
	}
	return s.Request, nil
}

func (a adapter) AddResponseHeaders(pairs [][2]string) error {
	s := a.w.cur
	if s == nil {
		return errNoStream
	}
	for _, p := range pairs {
		// Envoy copies what it is given; the plugin reuses the memory behind it.
		kv := [2]string{strings.Clone(p[0]), strings.Clone(p[1])}
		if s.Local != nil {
			s.Local.Headers = append(s.Local.Headers, kv)
		} else {
			s.Response = append(s.Response, kv)
		}
	}
	return nil
}

func (a adapter) ResponseHeader(name string) (string, bool) {
	s := a.w.cur
	if s == nil {
		return "", false
	}
	for _, kv := range s.upstream.Headers {
		if strings.EqualFold(kv[0], name) {
			return kv[1], true
		}
	}
	return "", false
}

func (a adapter) ResponseBody(start, max int) ([]byte, error) {
	s := a.w.cur
	if s == nil {
		return nil, errNoStream
	}
	if start > len(s.chunk) {
		return nil, errNotFound
	}
	// Envoy reads at most what is asked; a host may read less (the binding's 64 KiB).
	return s.chunk[start:min(len(s.chunk), start+max, start+64<<10)], nil
}

func (a adapter) SendLocalReply(status uint32, details string, body []byte, headers [][2]string, grpcStatus int32) error {
	s := a.w.cur
	if s == nil {
		return errNoStream
	}
	if s.Local != nil {
		return nil // the first local reply of a stream wins
	}
	s.Local = &LocalReply{Status: status, Details: strings.Clone(details), Body: append([]byte(nil), body...),
		Headers: clonePairs(headers), GRPCStatus: grpcStatus}
	return nil
}

// clonePairs copies pairs and their strings.
func clonePairs(pairs [][2]string) [][2]string {
	out := make([][2]string, len(pairs))
	for i, kv := range pairs {
		out[i] = [2]string{strings.Clone(kv[0]), strings.Clone(kv[1])}
	}
	return out
}

// SharedGet returns the value in one buffer per worker that the next call overwrites,
// as the wasm binding does, so tests catch a plugin that keeps a value too long.
func (a adapter) SharedGet(key string) ([]byte, uint32, bool, error) {
	if f := a.w.h.cfg.SharedFault; f != nil {
		if err := f(key); err != nil {
			return nil, 0, false, err
		}
	}
	v, cas, ok := a.w.h.shared.AppendGet(a.w.sharedBuf[:0], key)
	a.w.sharedBuf = v
	if !ok {
		return nil, 0, false, nil
	}
	return v, cas, ok, nil
}

func (a adapter) SharedSet(key string, value []byte, cas uint32) (bool, error) {
	if f := a.w.h.cfg.SharedFault; f != nil {
		if err := f(key); err != nil {
			return false, err
		}
	}
	return a.w.h.shared.Set(key, value, cas), nil
}

func (a adapter) Property(path ...string) ([]byte, error) {
	name := strings.Join(path, ".")
	if s := a.w.cur; s != nil {
		if v, ok := s.Properties[name]; ok {
			return []byte(v), nil
		}
	}
	if v, ok := a.w.h.cfg.Properties[name]; ok {
		return []byte(v), nil
	}
	return nil, errNotFound
}

// SetProperty keeps the value in the stream's filter state; a root context has none
// (Envoy answers NotFound there too).
func (a adapter) SetProperty(path string, value []byte) error {
	s := a.w.cur
	if s == nil {
		return errNotFound
	}
	if s.FilterState == nil {
		s.FilterState = map[string]string{}
	}
	s.FilterState[path] = string(value)
	return nil
}

func (a adapter) AppendProperty(dst []byte, path ...string) ([]byte, error) {
	v, err := a.Property(path...)
	if err != nil {
		return dst, err
	}
	return append(dst, v...), nil
}

func (a adapter) SetTickPeriod(ms uint32) error {
	a.w.tickMs = ms
	a.w.tickSets++
	return nil
}

func (a adapter) HTTPCall(cluster string, headers [][2]string, body []byte, timeoutMs uint32) (uint32, error) {
	if cluster == "" {
		return 0, errors.New("nativehost: unknown cluster (BadArgument)")
	}
	h := a.w.h
	h.token++
	c := &Callout{Token: h.token, Worker: a.w, Cluster: strings.Clone(cluster), Headers: clonePairs(headers),
		Body: append([]byte(nil), body...), TimeoutMs: timeoutMs, SentUs: h.cfg.Clock()}
	h.calls = append(h.calls, c)
	return c.Token, nil
}

func (a adapter) ResumeRequest() error {
	s := a.w.cur
	if s == nil || !s.Paused {
		return errNoStream
	}
	s.Decided = true
	return nil
}

func (a adapter) SetEffectiveContext(id uint32) error {
	if id == a.RootID() {
		a.w.cur = nil
		return nil
	}
	s, ok := a.w.streams[id]
	if !ok {
		return errBadContext
	}
	a.w.cur = s
	return nil
}

func (a adapter) RootID() uint32 { return 1 }

func (a adapter) Log(level plugin.LogLevel, msg string) {
	if f := a.w.h.cfg.Log; f != nil {
		f(level, msg)
	}
}

func (a adapter) DefineMetric(kind plugin.MetricKind, name string) (uint32, error) {
	h := a.w.h
	if m, ok := h.metrics[name]; ok {
		for i, x := range h.byID {
			if x == m {
				return uint32(i), nil
			}
		}
	}
	m := &metric{kind: kind}
	h.metrics[name] = m
	h.byID = append(h.byID, m)
	return uint32(len(h.byID) - 1), nil
}

func (a adapter) IncrementMetric(id uint32, delta int64) {
	if int(id) < len(a.w.h.byID) {
		a.w.h.byID[id].value += delta
	}
}

func (a adapter) RecordMetric(id uint32, value uint64) {
	if int(id) < len(a.w.h.byID) {
		m := a.w.h.byID[id]
		if m.kind == plugin.Counter {
			m.value += int64(value)
		} else {
			m.value = int64(value)
		}
	}
}

func (a adapter) NowUs() int64 { return a.w.h.cfg.Clock() }

// Seed derives each worker's random number from Config.Seed: a replayable run.
func (a adapter) Seed() uint64 {
	x := a.w.h.cfg.Seed + uint64(a.w.index+1)*0x9e3779b97f4a7c15 + a.w.gen*0xd1b54a32d192ed03
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

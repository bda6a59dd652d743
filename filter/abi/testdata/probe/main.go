// Command probe is a test module for the binding (filter/abi/wasm_test.go): each
// request picks, through its x-probe header, one part of the ABI to exercise inside the
// compiled module, and reports what happened through logs, headers and local replies.
package main

import (
	"strconv"

	"github.com/tollgate-rl/tollgate/filter/abi"
)

func init() { abi.SetRoot(&root{}) }

// main never runs: the module is a WASI reactor.
func main() {}

type root struct {
	host     abi.Host
	requests uint32
}

func (r *root) OnVMStart([]byte) bool { return true }

func (r *root) OnPluginStart(cfg []byte) bool {
	r.host.Log(abi.LogInfo, "probe: config="+string(cfg))
	id, err := r.host.DefineMetric(abi.MetricCounter, "probe.requests")
	if err != nil {
		r.host.Log(abi.LogError, "probe: define metric: "+err.Error())
		return false
	}
	r.requests = id
	return string(cfg) != "reject"
}

// OnTick dispatches a call from the root context.
func (r *root) OnTick() {
	token, err := r.host.DispatchHTTPCall("root-cluster",
		[][2]string{{":method", "GET"}, {":path", "/tick"}, {":authority", "svc"}}, nil, nil, 500)
	if err != nil {
		r.host.Log(abi.LogError, "probe: tick callout: "+err.Error())
		return
	}
	r.host.Log(abi.LogInfo, "probe: tick callout token="+strconv.Itoa(int(token)))
}

func (r *root) OnHTTPCallResponse(token uint32, headers [][2]string, body []byte) {
	r.host.Log(abi.LogInfo, "probe: root callout response token="+strconv.Itoa(int(token))+
		" headers="+strconv.Itoa(len(headers))+" body="+string(body))
}

func (r *root) NewStream(uint32) abi.Stream { return &stream{root: r} }

type stream struct {
	root *root
	host abi.Host
}

func (s *stream) OnRequestHeaders(numHeaders int, _ bool) abi.Action {
	if err := s.host.IncrementMetric(s.root.requests, 1); err != nil {
		s.host.Log(abi.LogError, "probe: increment: "+err.Error())
	}
	headers, err := s.host.RequestHeaders()
	if err != nil {
		s.host.Log(abi.LogError, "probe: request headers: "+err.Error())
		return abi.Continue
	}
	if len(headers) != numHeaders {
		s.host.Log(abi.LogError, "probe: got "+strconv.Itoa(len(headers))+" headers, host said "+strconv.Itoa(numHeaders))
	}
	mode := ""
	for _, kv := range headers {
		if kv[0] == "x-probe" {
			mode = kv[1]
		}
	}
	switch mode {
	case "panic":
		var m map[string]int
		m["boom"]++ // nil map write: a runtime panic the binding must recover
	case "reply":
		err := s.host.SendLocalReply(429, "tollgate_rate_limited", []byte(`{"error":"slow down"}`),
			[][2]string{{"retry-after", "7"}}, -1)
		if err != nil {
			s.host.Log(abi.LogError, "probe: local reply: "+err.Error())
			return abi.Continue
		}
		return abi.Pause
	case "callout":
		_, err := s.host.DispatchHTTPCall("svc",
			[][2]string{{":method", "POST"}, {":path", "/check"}, {":authority", "svc"}}, []byte("check"), nil, 1000)
		if err != nil {
			s.host.Log(abi.LogError, "probe: callout: "+err.Error())
			return abi.Continue
		}
		return abi.Pause
	case "property":
		v, err := s.host.GetProperty("node", "id")
		if err != nil {
			s.host.Log(abi.LogError, "probe: property: "+err.Error())
			return abi.Continue
		}
		if err := s.host.AddRequestHeader("x-node-id", string(v)); err != nil {
			s.host.Log(abi.LogError, "probe: add request header: "+err.Error())
		}
	case "metric":
		v, err := s.host.GetMetric(s.root.requests)
		if err != nil {
			s.host.Log(abi.LogError, "probe: get metric: "+err.Error())
			return abi.Continue
		}
		s.host.Log(abi.LogInfo, "probe: requests="+strconv.FormatUint(v, 10))
	case "shared":
		// A CAS write with a stale token must come back as ErrCasMismatch.
		if err := s.host.SetSharedData("probe:k", []byte("v1"), 0); err != nil {
			s.host.Log(abi.LogError, "probe: set: "+err.Error())
		}
		v, cas, err := s.host.AppendSharedData(nil, "probe:k")
		if err != nil {
			s.host.Log(abi.LogError, "probe: get: "+err.Error())
		}
		err = s.host.SetSharedData("probe:k", []byte("v2"), cas+7)
		s.host.Log(abi.LogInfo, "probe: shared value="+string(v)+" stale_cas_mismatch="+
			strconv.FormatBool(err == abi.ErrCasMismatch))
		if _, _, err := s.host.GetSharedData("probe:absent"); err != abi.ErrNotFound {
			s.host.Log(abi.LogError, "probe: absent key did not report ErrNotFound")
		}
	}
	return abi.Continue
}

// OnHTTPCallResponse makes stream a CalloutStream: a 200 resumes the request,
// anything else (or a failed call) answers 503 locally.
func (s *stream) OnHTTPCallResponse(token uint32, headers [][2]string, body []byte) {
	status := ""
	for _, kv := range headers {
		if kv[0] == ":status" {
			status = kv[1]
		}
	}
	s.host.Log(abi.LogInfo, "probe: stream callout response status="+status+" body="+string(body))
	if status == "200" {
		if err := s.host.ResumeHTTPRequest(); err != nil {
			s.host.Log(abi.LogError, "probe: resume: "+err.Error())
		}
		return
	}
	if err := s.host.SendLocalReply(503, "tollgate_check_failed", nil, nil, -1); err != nil {
		s.host.Log(abi.LogError, "probe: local reply: "+err.Error())
	}
}

func (s *stream) OnResponseHeaders(numHeaders int, _ bool) abi.Action {
	headers, err := s.host.ResponseHeaders()
	if err != nil {
		s.host.Log(abi.LogError, "probe: response headers: "+err.Error())
		return abi.Continue
	}
	if err := s.host.ReplaceResponseHeader("x-probe-seen", strconv.Itoa(len(headers))); err != nil {
		s.host.Log(abi.LogError, "probe: replace response header: "+err.Error())
	}
	return abi.Continue
}

func (s *stream) OnLog()  { s.host.Log(abi.LogDebug, "probe: log") }
func (s *stream) OnDone() { s.host.Log(abi.LogDebug, "probe: done") }

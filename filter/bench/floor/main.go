// Command floor is the cost floor of one single-rule decision: exactly the host calls
// Tollgate cannot avoid and no logic. On request headers it reads all headers once,
// reads the bucket from shared data and writes it back with the CAS token it got; on
// response headers it adds the four rate-limit headers. Whatever the real filter costs
// above this module is the price of its own logic.
//
// For tests it reports what the binding keeps pinned: on every tick it records
// abi.PinnedBuffers() and abi.Streams() in the gauges floor.pinned_buffers and
// floor.streams (ticks are off the request path). Host call failures are logged at
// error level, so a test can assert there were none.
package main

import "github.com/tollgate-rl/tollgate/filter/abi"

const bucketKey = "tg:floor"

func init() { abi.SetRoot(&root{}) }

// main never runs: the module is a WASI reactor.
func main() {}

type root struct {
	host            abi.Host
	pinned, streams uint32
}

func (r *root) OnVMStart([]byte) bool { return true }

func (r *root) OnPluginStart([]byte) bool {
	var err error
	if r.pinned, err = r.host.DefineMetric(abi.MetricGauge, "floor.pinned_buffers"); err != nil {
		r.host.Log(abi.LogError, "floor: define metric: "+err.Error())
		return false
	}
	if r.streams, err = r.host.DefineMetric(abi.MetricGauge, "floor.streams"); err != nil {
		r.host.Log(abi.LogError, "floor: define metric: "+err.Error())
		return false
	}
	return true
}

func (r *root) OnTick() {
	r.host.RecordMetric(r.pinned, uint64(abi.PinnedBuffers()))
	r.host.RecordMetric(r.streams, uint64(abi.Streams()))
}

func (r *root) OnHTTPCallResponse(uint32, [][2]string, []byte) {}

func (r *root) NewStream(uint32) abi.Stream { return stream{} }

type stream struct{}

// Buffers reused across requests, as the real filter would: the header slice and the
// bucket record. The strings in headers alias the host's buffer of the latest call.
var (
	headers [][2]string
	bucket  []byte
)

// initialBucket stands in for an encoded bucket record when the key is new.
var initialBucket = make([]byte, 32)

func (stream) OnRequestHeaders(int, bool) abi.Action {
	var h abi.Host
	var err error
	if headers, err = h.AppendRequestHeaders(headers[:0]); err != nil {
		h.Log(abi.LogError, "floor: request headers: "+err.Error())
	}
	var cas uint32
	bucket, cas, err = h.AppendSharedData(bucket[:0], bucketKey)
	switch {
	case err == abi.ErrNotFound:
		bucket, cas = append(bucket[:0], initialBucket...), 0
	case err != nil:
		h.Log(abi.LogError, "floor: get shared data: "+err.Error())
		return abi.Continue
	}
	if err := h.SetSharedData(bucketKey, bucket, cas); err != nil {
		h.Log(abi.LogError, "floor: set shared data: "+err.Error())
	}
	return abi.Continue
}

func (stream) OnResponseHeaders(int, bool) abi.Action {
	var h abi.Host
	for _, kv := range rateLimitHeaders {
		if err := h.AddResponseHeader(kv[0], kv[1]); err != nil {
			h.Log(abi.LogError, "floor: add response header: "+err.Error())
		}
	}
	return abi.Continue
}

var rateLimitHeaders = [4][2]string{
	{"X-RateLimit-Limit", "100"},
	{"X-RateLimit-Remaining", "99"},
	{"X-RateLimit-Reset", "1700000060"},
	{"RateLimit", `"default";r=99;t=60`},
}

func (stream) OnLog()  {}
func (stream) OnDone() {}

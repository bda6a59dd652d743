package rls

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/header"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// rulesDoc is the rule set of these tests: per-API-key limits selected by descriptors
// (and one also by an HTTP match, as a fleet mixing both filters writes it).
const rulesDoc = `{"rules": [
  {"id": "per-key", "limit": 5, "window": "1h", "match": {"prefix": "/"},
   "descriptors": {"domain": "api", "entries": [{"key": "api_key"}]}},
  {"id": "uploads", "limit": 10, "window": "1h",
   "descriptors": {"domain": "api", "entries": [{"key": "route", "value": "upload"}, {"key": "api_key"}]}},
  {"id": "dry-run", "limit": 1, "window": "1h", "shadow": true,
   "descriptors": {"domain": "shadow", "entries": [{"key": "api_key"}]}},
  {"id": "open", "limit": 100, "window": "1h", "fail": "open",
   "descriptors": {"domain": "failing", "entries": [{"key": "open_key"}]}},
  {"id": "closed", "limit": 100, "window": "1h", "fail": "closed",
   "descriptors": {"domain": "failing", "entries": [{"key": "closed_key"}]}}
]}`

func desc(kv ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func headers(resp *rlsv3.RateLimitResponse) map[string]string {
	h := map[string]string{}
	for _, v := range resp.ResponseHeadersToAdd {
		h[v.Key] = v.Value
	}
	return h
}

// TestAdmitsUpToTheLimit: a caller is admitted up to the rule's limit, then refused,
// with the per-descriptor status and the filter's RateLimit headers; on a standalone
// server and on a cluster.
func TestAdmitsUpToTheLimit(t *testing.T) {
	for _, mode := range []store.Mode{store.Standalone, store.Cluster} {
		t.Run(string(mode), func(t *testing.T) {
			e := start(t, opts{mode: mode})
			e.putRules(t, rulesDoc)
			key := uniq("alice")
			req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{desc("api_key", key)}}
			for i := 1; i <= 6; i++ {
				resp, err := e.call(t, secret, req)
				if err != nil {
					t.Fatal(err)
				}
				h := headers(resp)
				st := resp.Statuses[0]
				if len(resp.Statuses) != 1 || st.CurrentLimit == nil {
					t.Fatalf("call %d: statuses %v", i, resp.Statuses)
				}
				if st.CurrentLimit.RequestsPerUnit != 5 || st.CurrentLimit.Unit != rlsv3.RateLimitResponse_RateLimit_HOUR || st.CurrentLimit.Name != "per-key-1h" {
					t.Errorf("call %d: current_limit %v, want 5 per HOUR named per-key-1h", i, st.CurrentLimit)
				}
				if d := st.DurationUntilReset.AsDuration(); d <= 0 || d > time.Hour {
					t.Errorf("call %d: duration_until_reset %v", i, d)
				}
				if h[header.XLimit] != "5" || h[header.Policy] != `"per-key-1h";q=5;w=3600` {
					t.Errorf("call %d: headers %v", i, h)
				}
				if i <= 5 {
					if resp.OverallCode != rlsv3.RateLimitResponse_OK || st.Code != rlsv3.RateLimitResponse_OK {
						t.Fatalf("call %d: %v, want OK", i, resp.OverallCode)
					}
					if want := uint32(5 - i); st.LimitRemaining != want || h[header.XRemaining] != strconv.Itoa(int(want)) {
						t.Errorf("call %d: remaining %d (header %q), want %d", i, st.LimitRemaining, h[header.XRemaining], want)
					}
					if _, ok := h[header.RetryAfter]; ok {
						t.Errorf("call %d: retry-after on an admitted call", i)
					}
					continue
				}
				if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || st.Code != rlsv3.RateLimitResponse_OVER_LIMIT {
					t.Fatalf("call %d: %v, want OVER_LIMIT", i, resp.OverallCode)
				}
				if h[header.XRule] != "per-key" || h[header.RetryAfter] == "" || h[header.XRemaining] != "0" {
					t.Errorf("refusal headers %v", h)
				}
				if !strings.Contains(string(resp.RawBody), `"per-key"`) || h[header.ContentType] != header.ContentTypeJSON {
					t.Errorf("refusal body %q, headers %v", resp.RawBody, h)
				}
			}
		})
	}
}

// TestSharesTheFiltersBucket: a strict check as the Wasm filter sends it (/v1/check's
// path, the same delta the filter builds) and ShouldRateLimit charge one bucket.
func TestSharesTheFiltersBucket(t *testing.T) {
	e := start(t, opts{})
	e.putRules(t, rulesDoc)
	key := uniq("bob")
	b := wire.Batch{Node: "gw-test", Seq: 1, Deltas: []wire.Delta{{Key: key, Rule: "per-key", Flags: wire.FlagStrict, Over: 3,
		Algo: uint8(algo.TokenBucket), Limit: 5, WindowMs: 3600_000}}}
	out, err := e.svc.Check(t.Context(), "check", &b)
	if err != nil || !out.States[0].Allowed() {
		t.Fatalf("filter's check: %v %+v", err, out)
	}
	resp, err := e.call(t, secret, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{desc("api_key", key)}})
	if err != nil {
		t.Fatal(err)
	}
	if st := resp.Statuses[0]; st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != 1 {
		t.Fatalf("after the filter took 3 of 5: %v remaining %d, want OK remaining 1", st.Code, st.LimitRemaining)
	}
	b.Deltas[0].Over = 2
	if out, err = e.svc.Check(t.Context(), "check", &b); err != nil || out.States[0].Allowed() {
		t.Fatalf("filter's check after ShouldRateLimit took the 4th: %v allowed %v, want refused", err, out.States[0].Allowed())
	}
}

// TestHitsAddend: the request's hits_addend is the cost, a descriptor's own overrides
// it, and a descriptor that selects two rules charges both; decided from leases (a cost
// above what the lease holds takes that part from it and acquires the rest) and in
// Redis.
func TestHitsAddend(t *testing.T) {
	for _, leases := range []LeaseOptions{{}, {Off: true}} {
		t.Run(fmt.Sprintf("leases off %v", leases.Off), func(t *testing.T) { testHitsAddend(t, leases) })
	}
}

func testHitsAddend(t *testing.T, leases LeaseOptions) {
	e := start(t, opts{mode: store.Cluster, leases: leases})
	e.putRules(t, rulesDoc)
	key := uniq("carol")
	upload := desc("route", "upload", "api_key", key)
	for i, tt := range []struct {
		req       *rlsv3.RateLimitRequest
		code      rlsv3.RateLimitResponse_Code
		remaining uint32
	}{
		{&rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 4, Descriptors: []*commonv3.RateLimitDescriptor{upload}}, rlsv3.RateLimitResponse_OK, 6},
		{&rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 4, Descriptors: []*commonv3.RateLimitDescriptor{
			{Entries: upload.Entries, HitsAddend: wrapperspb.UInt64(5)}}}, rlsv3.RateLimitResponse_OK, 1},
		{&rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 2, Descriptors: []*commonv3.RateLimitDescriptor{upload}}, rlsv3.RateLimitResponse_OVER_LIMIT, 1},
		{&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{upload}}, rlsv3.RateLimitResponse_OK, 0},
		// api_key alone selects per-key (5): it has seen none of this key's uploads.
		{&rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 5, Descriptors: []*commonv3.RateLimitDescriptor{desc("api_key", key), upload}},
			rlsv3.RateLimitResponse_OVER_LIMIT, 0},
	} {
		resp, err := e.call(t, secret, tt.req)
		if err != nil {
			t.Fatal(err)
		}
		last := resp.Statuses[len(resp.Statuses)-1]
		if resp.OverallCode != tt.code || last.LimitRemaining != tt.remaining {
			t.Fatalf("call %d: %v remaining %d, want %v remaining %d", i, resp.OverallCode, last.LimitRemaining, tt.code, tt.remaining)
		}
	}
}

// TestAuthentication: without the sync secret in the metadata the call is refused
// UNAUTHENTICATED; with --insecure and no secret anyone is served.
func TestAuthentication(t *testing.T) {
	e := start(t, opts{})
	e.putRules(t, rulesDoc)
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{desc("api_key", uniq("dave"))}}
	for _, tok := range []string{"", "wrong", secret + "x"} {
		if _, err := e.call(t, tok, req); status.Code(err) != codes.Unauthenticated {
			t.Errorf("token %q: %v, want Unauthenticated", tok, err)
		}
	}
	if _, err := e.call(t, secret, req); err != nil {
		t.Fatalf("with the secret: %v", err)
	}
	open := start(t, opts{insecure: true})
	if _, err := open.call(t, "", req); err != nil {
		t.Fatalf("insecure service without a bearer: %v", err)
	}
}

// TestShadow: a shadow rule never refuses; a call it would have refused says so
// (x-ratelimit-shadow) and is counted.
func TestShadow(t *testing.T) {
	e := start(t, opts{})
	e.putRules(t, rulesDoc)
	req := &rlsv3.RateLimitRequest{Domain: "shadow", Descriptors: []*commonv3.RateLimitDescriptor{desc("api_key", uniq("erin"))}}
	before := testutil.ToFloat64(e.srv.m.descriptors.WithLabelValues("shadow_over_limit"))
	for i := 1; i <= 3; i++ {
		resp, err := e.call(t, secret, req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d: %v, want OK (shadow)", i, resp.OverallCode)
		}
		if got, want := headers(resp)[header.XShadow], map[bool]string{true: "", false: "dry-run"}[i == 1]; got != want {
			t.Errorf("call %d: x-ratelimit-shadow %q, want %q", i, got, want)
		}
	}
	if got := testutil.ToFloat64(e.srv.m.descriptors.WithLabelValues("shadow_over_limit")) - before; got != 2 {
		t.Errorf("shadow_over_limit counted %v, want 2", got)
	}
}

// TestFailModes: with Redis unreachable a fail-open rule answers OK marked degraded, a
// fail-closed one OVER_LIMIT with the filter's 503 body.
func TestFailModes(t *testing.T) {
	own := redistest.StartStandalone(t)
	e := start(t, opts{addrs: own.Addrs(), store: func(c *store.Config) {
		c.DialTimeout, c.ReadTimeout, c.WriteTimeout, c.MaxRetries = 100*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond, -1
	}})
	e.putRules(t, rulesDoc)
	open := &rlsv3.RateLimitRequest{Domain: "failing", Descriptors: []*commonv3.RateLimitDescriptor{desc("open_key", "k")}}
	closed := &rlsv3.RateLimitRequest{Domain: "failing", Descriptors: []*commonv3.RateLimitDescriptor{desc("closed_key", "k")}}
	for _, req := range []*rlsv3.RateLimitRequest{open, closed} {
		if resp, err := e.call(t, secret, req); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("with Redis up: %v %v", resp, err)
		}
	}
	if err := own.Kill(); err != nil {
		t.Fatal(err)
	}
	// The replica's leases are valid reservations: it decides from them until its syncs
	// fail (within a few sync intervals), then degraded.
	var resp *rlsv3.RateLimitResponse
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; {
		if resp, err = e.call(t, secret, open); err != nil {
			t.Fatal(err)
		}
		if headers(resp)[header.XPolicy] == header.PolicyDegraded || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if h := headers(resp); resp.OverallCode != rlsv3.RateLimitResponse_OK || h[header.XPolicy] != header.PolicyDegraded || h[header.XRemaining] != header.RemainingUnknown {
		t.Errorf("fail-open rule, Redis down: %v headers %v, want OK degraded", resp.OverallCode, h)
	}
	resp, err = e.call(t, secret, closed)
	if err != nil {
		t.Fatal(err)
	}
	h := headers(resp)
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || h[header.XPolicy] != header.PolicyDegraded || h[header.XRule] != "closed" || h[header.RetryAfter] != "1" {
		t.Errorf("fail-closed rule, Redis down: %v headers %v, want OVER_LIMIT degraded", resp.OverallCode, h)
	}
	if !strings.Contains(string(resp.RawBody), `"closed"`) {
		t.Errorf("fail-closed body %q", resp.RawBody)
	}
}

// TestRefusesMalformedRequests: what Envoy's configuration decides and the service
// does not do gets INVALID_ARGUMENT naming the field, before any work.
func TestRefusesMalformedRequests(t *testing.T) {
	e := start(t, opts{})
	for _, tt := range []struct {
		name  string
		req   *rlsv3.RateLimitRequest
		field string
	}{
		{"no domain", &rlsv3.RateLimitRequest{Descriptors: []*commonv3.RateLimitDescriptor{desc("api_key", "x")}}, "domain"},
		{"negative hits", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{
			{Entries: desc("api_key", "x").Entries, IsNegativeHits: true}}}, "descriptors[0].is_negative_hits"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.call(t, secret, tt.req)
			if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(err).Message(), tt.field+":") {
				t.Errorf("got %v, want InvalidArgument naming %s", err, tt.field)
			}
		})
	}
}

// TestClientInputIsLimited: what a client controls — a descriptor value of any length
// or empty, a hits_addend of any size, any number of descriptors — is answered, never
// an error (with Envoy's failure_mode_deny: false an error admits the request with no
// limit). Each case is limited by the per-key rule (5 per hour).
func TestClientInputIsLimited(t *testing.T) {
	e := start(t, opts{})
	e.putRules(t, rulesDoc)
	long := func(n int) string { return uniq("k") + strings.Repeat("v", n) }
	one := func(v string) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{desc("api_key", v)}}
	}
	// admitsFive sends req six times: five admitted, the sixth refused.
	admitsFive := func(t *testing.T, req *rlsv3.RateLimitRequest) {
		t.Helper()
		for i := 1; i <= 6; i++ {
			resp, err := e.call(t, secret, req)
			if err != nil {
				t.Fatalf("call %d: %v, want an answer", i, err)
			}
			if want := map[bool]rlsv3.RateLimitResponse_Code{true: rlsv3.RateLimitResponse_OK, false: rlsv3.RateLimitResponse_OVER_LIMIT}[i <= 5]; resp.OverallCode != want {
				t.Fatalf("call %d: %v, want %v", i, resp.OverallCode, want)
			}
		}
	}
	t.Run("value of 257 bytes", func(t *testing.T) { admitsFive(t, one(long(257))) })
	t.Run("value of 1 MiB", func(t *testing.T) { admitsFive(t, one(long(1<<20))) })
	t.Run("long values with one prefix are distinct callers", func(t *testing.T) {
		prefix := long(300)
		admitsFive(t, one(prefix+"a"))
		admitsFive(t, one(prefix+"b"))
	})
	t.Run("empty value", func(t *testing.T) {
		// One bucket for every empty value: the test's Redis is shared, so it starts
		// from what is there, and must refuse within five more calls.
		refused := false
		for i := 0; i < 6 && !refused; i++ {
			resp, err := e.call(t, secret, one(""))
			if err != nil {
				t.Fatal(err)
			}
			refused = resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT
			if !refused && (len(resp.Statuses) != 1 || resp.Statuses[0].CurrentLimit == nil) {
				t.Fatalf("empty value answered OK with no limit: %v", resp)
			}
		}
		if !refused {
			t.Fatal("six calls with an empty value were all admitted, limit 5")
		}
	})
	clamped := func() float64 { return testutil.ToFloat64(e.srv.m.clamped) }
	for _, tt := range []struct {
		name    string
		req     func(key string) *rlsv3.RateLimitRequest
		clamped float64
	}{
		{"hits_addend above every rule's capacity", func(key string) *rlsv3.RateLimitRequest {
			r := one(key)
			r.HitsAddend = 5000
			return r
		}, 0},
		{"hits_addend above the largest cost", func(key string) *rlsv3.RateLimitRequest {
			r := one(key)
			r.HitsAddend = 1<<32 - 1
			return r
		}, 1},
		{"a descriptor's hits_addend above the largest cost", func(key string) *rlsv3.RateLimitRequest {
			return &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{
				{Entries: desc("api_key", key).Entries, HitsAddend: wrapperspb.UInt64(1 << 60)}}}
		}, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			key := uniq("hits")
			before := clamped()
			resp, err := e.call(t, secret, tt.req(key))
			if err != nil {
				t.Fatalf("%v, want OVER_LIMIT", err)
			}
			if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].LimitRemaining != 5 {
				t.Fatalf("%v remaining %d, want OVER_LIMIT with the key's 5 untouched", resp.OverallCode, resp.Statuses[0].LimitRemaining)
			}
			if got := clamped() - before; got != tt.clamped {
				t.Errorf("clamps counted %v, want %v", got, tt.clamped)
			}
			admitsFive(t, one(key)) // the refused request took nothing
		})
	}
	t.Run("more than 64 descriptors", func(t *testing.T) {
		key := uniq("many")
		many := make([]*commonv3.RateLimitDescriptor, MaxDescriptors+1)
		for i := range many {
			many[i] = desc("api_key", key)
		}
		resp, err := e.call(t, secret, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: many})
		if err != nil {
			t.Fatalf("%v, want OVER_LIMIT", err)
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || len(resp.Statuses) != len(many) {
			t.Fatalf("%v with %d statuses, want OVER_LIMIT for each of %d", resp.OverallCode, len(resp.Statuses), len(many))
		}
		resp, err = e.call(t, secret, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: many[:MaxDescriptors]})
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("64 descriptors of one key, limit 5: %v %v, want OVER_LIMIT (charged together)", resp, err)
		}
		admitsFive(t, one(key)) // neither request took anything
	})
	t.Run("no descriptors", func(t *testing.T) {
		resp, err := e.call(t, secret, &rlsv3.RateLimitRequest{Domain: "api"})
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.Statuses) != 0 {
			t.Fatalf("%v %v, want OK with no statuses (nothing to limit)", resp, err)
		}
	})
}

// TestUnmatchedDescriptors: descriptors no rule selects are OK, with no limit.
func TestUnmatchedDescriptors(t *testing.T) {
	e := start(t, opts{})
	e.putRules(t, rulesDoc)
	resp, err := e.call(t, secret, &rlsv3.RateLimitRequest{Domain: "other", Descriptors: []*commonv3.RateLimitDescriptor{desc("api_key", "x"), desc("a", "b")}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.Statuses) != 2 || resp.Statuses[0].CurrentLimit != nil || len(resp.ResponseHeadersToAdd) != 0 {
		t.Fatalf("got %v", resp)
	}
}

func TestCurrentLimit(t *testing.T) {
	for _, tt := range []struct {
		window string
		us     int64
		unit   rlsv3.RateLimitResponse_RateLimit_Unit
		mult   uint32 // 0: none
	}{
		{"1s", 1e6, rlsv3.RateLimitResponse_RateLimit_SECOND, 0},
		{"1m", 60e6, rlsv3.RateLimitResponse_RateLimit_MINUTE, 0},
		{"90s", 90e6, rlsv3.RateLimitResponse_RateLimit_SECOND, 90},
		{"2h", 7200e6, rlsv3.RateLimitResponse_RateLimit_HOUR, 2},
		{"7d", 7 * 86400e6, rlsv3.RateLimitResponse_RateLimit_DAY, 7},
		{"1500ms rounds up", 1500e3, rlsv3.RateLimitResponse_RateLimit_SECOND, 2},
		{"200ms rounds up", 200e3, rlsv3.RateLimitResponse_RateLimit_SECOND, 0},
	} {
		t.Run(tt.window, func(t *testing.T) {
			rl := currentLimit("p", algo.Params{Limit: 10, WindowUs: tt.us})
			var mult uint32
			if rl.UnitMultiplier != nil {
				mult = rl.UnitMultiplier.Value
			}
			if rl.RequestsPerUnit != 10 || rl.Unit != tt.unit || mult != tt.mult || rl.Name != "p" {
				t.Errorf("got %v, want 10 per %d %v", rl, tt.mult, tt.unit)
			}
		})
	}
}

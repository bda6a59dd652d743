package main

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/tollgate-rl/tollgate/shared/wire"
)

// syncConfig is a plugin configuration with a sync service; extra is spliced into the rule.
func syncConfig(extraSync, rules string) string {
	return `{"key":{"source":"header","name":"x-api-key"},
		"sync":{"cluster":"tollgate_ratelimit","authority":"ratelimit","secret":"s3cret","node":"gw-test",
			"interval_ms":100,"timeout_ms":250,"lease_ttl_ms":60000,"expected_nodes":1` + extraSync + `},
		"rules":[` + rules + `]}`
}

const plainRule = `{"id":"api","limit":100,"window":"1m"}`

// callouts returns the root context's callouts from index from on.
func (e *emu) callouts(from int) []proxytest.HttpCalloutAttribute {
	all := e.host.GetCalloutAttributesFromContext(proxytest.PluginContextID)
	if from > len(all) {
		return nil
	}
	return all[from:]
}

func decodeBatch(t *testing.T, c proxytest.HttpCalloutAttribute) *wire.Batch {
	t.Helper()
	var b wire.Batch
	if err := wire.DecodeBatch(c.Body, &b); err != nil {
		t.Fatalf("callout body is not a batch: %v", err)
	}
	return &b
}

func hdr(h [][2]string, name string) string {
	for _, kv := range h {
		if kv[0] == name {
			return kv[1]
		}
	}
	return ""
}

// reply answers a callout with a 200 and an encoded wire.Reply.
func (e *emu) reply(t *testing.T, id uint32, r *wire.Reply) {
	t.Helper()
	body, err := wire.AppendReply(nil, r)
	if err != nil {
		t.Fatal(err)
	}
	e.host.CallOnHttpCallResponse(id, [][2]string{{":status", "200"}}, nil, body)
}

func (e *emu) fail(id uint32) {
	e.host.CallOnHttpCallResponse(id, [][2]string{{":status", "503"}}, nil, []byte("upstream connect error"))
}

func deltaFor(b *wire.Batch, key string) *wire.Delta {
	for i := range b.Deltas {
		if b.Deltas[i].Key == key {
			return &b.Deltas[i]
		}
	}
	return nil
}

// One callout per tick carries every delta; the reply's lease and global state are what
// the next answers report.
func TestSyncBatchesAndReplies(t *testing.T) {
	e := startEmu(t, syncConfig("", plainRule))
	if p := e.host.GetTickPeriod(); p != 100 {
		t.Fatalf("tick period %d, want 100", p)
	}
	e.do("/x", "x-api-key", "a") // a new bucket asks for an early flush
	first := e.callouts(0)
	if len(first) != 1 {
		t.Fatalf("want one early flush, got %d callouts", len(first))
	}
	c := first[0]
	if c.Upstream != "tollgate_ratelimit" || hdr(c.Headers, ":path") != "/v1/sync" || hdr(c.Headers, ":method") != "POST" ||
		hdr(c.Headers, "authorization") != "Bearer s3cret" || hdr(c.Headers, ":authority") != "ratelimit" {
		t.Fatalf("callout %s %v", c.Upstream, c.Headers)
	}
	b0 := decodeBatch(t, c)
	if b0.Node != "gw-test" || len(b0.Deltas) != 1 || b0.Deltas[0].Over != 1 || b0.Deltas[0].Flags&wire.FlagNew == 0 {
		t.Fatalf("early batch %+v", b0)
	}
	// More traffic while the first batch is in flight: no second callout yet.
	for _, k := range []string{"a", "a", "b", "b", "b", "c"} {
		e.do("/x", "x-api-key", k)
	}
	e.host.Tick()
	if n := len(e.callouts(0)); n != 1 {
		t.Fatalf("%d callouts while one is in flight, want 1", n)
	}
	if v, _ := e.host.GetGaugeMetric("tollgate.pending_deltas"); v != 3 {
		t.Fatalf("pending_deltas gauge %d, want 3 buckets waiting (a, b, c)", v)
	}
	e.reply(t, c.CalloutID, &wire.Reply{RulesVersion: 0, Nodes: 1, States: []wire.State{
		{Key: "a", Rule: "api", Lease: 10, LeaseHeld: 10, Remaining: 50, ResetInMs: 30000},
	}})
	e.host.Tick()
	next := e.callouts(1)
	if len(next) != 1 {
		t.Fatalf("want one callout on the tick, got %d", len(next))
	}
	if v, _ := e.host.GetGaugeMetric("tollgate.pending_deltas"); v != 0 {
		t.Fatalf("pending_deltas gauge %d after the cut, want 0", v)
	}
	b1 := decodeBatch(t, next[0])
	if b1.Seq != b0.Seq+1 {
		t.Fatalf("seq %d after %d", b1.Seq, b0.Seq)
	}
	if len(b1.Deltas) != 3 {
		t.Fatalf("tick batch has %d deltas, want a, b, c in one batch: %+v", len(b1.Deltas), b1.Deltas)
	}
	for key, want := range map[string]uint32{"a": 2, "b": 3, "c": 1} {
		d := deltaFor(b1, key)
		if d == nil || d.Leased+d.Over != want || d.Algo != 0 || d.Limit != 100 || d.WindowMs != 60000 {
			t.Fatalf("delta %s = %+v, want %d consumed", key, d, want)
		}
	}
	// a now spends from its lease: 10 granted, 1 used here -> 9 left, plus the global 50
	// less the 2 cold admissions of a this reply could not include (sent in the next batch).
	a := e.do("/x", "x-api-key", "a")
	if a.get("x-ratelimit-remaining") != "57" {
		t.Fatalf("remaining after the reply: %q, want 57 (lease 9 + global 50 - 2 unreported)", a.get("x-ratelimit-remaining"))
	}
	if got := e.counter("sync_sent"); got != 2 {
		t.Fatalf("sync_sent %d", got)
	}
}

// A failed callout keeps its batch; the next tick resends it unchanged (same seq), so the
// service can apply it exactly once.
func TestFailedSyncResendsSameBatch(t *testing.T) {
	e := startEmu(t, syncConfig(`,"breaker_failures":5`, plainRule))
	e.do("/x", "x-api-key", "a")
	c0 := e.callouts(0)[0]
	e.do("/x", "x-api-key", "b") // pending for the next batch
	e.fail(c0.CalloutID)
	e.host.Tick()
	c1 := e.callouts(1)
	if len(c1) != 1 || !bytes.Equal(c1[0].Body, c0.Body) {
		t.Fatalf("resend differs from the failed batch (%d callouts)", len(c1))
	}
	// Timeouts and resets (no headers at all) keep it too.
	e.host.CallOnHttpCallResponse(c1[0].CalloutID, nil, nil, nil)
	e.host.Tick()
	c2 := e.callouts(2)
	if len(c2) != 1 || !bytes.Equal(c2[0].Body, c0.Body) {
		t.Fatal("resend after a reset differs from the batch")
	}
	e.reply(t, c2[0].CalloutID, &wire.Reply{Nodes: 1})
	e.host.Tick()
	c3 := e.callouts(3)
	if len(c3) != 1 {
		t.Fatalf("want the next batch, got %d callouts", len(c3))
	}
	b3 := decodeBatch(t, c3[0])
	if b3.Seq != decodeBatch(t, c0).Seq+1 || deltaFor(b3, "b") == nil || deltaFor(b3, "a") != nil {
		t.Fatalf("after the ack the next batch carries only the new delta: %+v", b3)
	}
	if got := e.counter("sync_failed"); got != 2 {
		t.Fatalf("sync_failed %d", got)
	}
}

// Consecutive failures open the breaker: no callout per tick, answers degraded (fail-open)
// or 503 (fail-closed); after the open period one probe goes out and its success closes it.
func TestBreakerDegradedAndRecovery(t *testing.T) {
	e := startEmu(t, syncConfig(`,"breaker_failures":2,"breaker_open_ms":150`,
		plainRule+`,{"id":"pay","match":{"prefix":"/pay"},"limit":100,"window":"1m","fail":"closed"}`))
	e.do("/x", "x-api-key", "a")
	e.fail(e.callouts(0)[0].CalloutID)
	e.host.Tick()
	e.fail(e.callouts(1)[0].CalloutID) // second consecutive failure: open
	e.host.Tick()
	e.host.Tick()
	if n := len(e.callouts(0)); n != 2 {
		t.Fatalf("open breaker still calls out: %d callouts", n)
	}
	a := e.do("/x", "x-api-key", "a")
	if a.status != 200 || a.get("x-ratelimit-remaining") != "-1" || a.get("x-ratelimit-policy") != "degraded" {
		t.Fatalf("fail-open answer: %d %v", a.status, a.headers)
	}
	p := e.do("/pay", "x-api-key", "a")
	if p.status != 503 || p.get("retry-after") == "" || p.get("x-ratelimit-policy") != "degraded" || !strings.Contains(p.body, "RATE_LIMITER_UNAVAILABLE") {
		t.Fatalf("fail-closed answer: %d %v %s", p.status, p.headers, p.body)
	}
	if e.counter("answers_degraded") < 2 || e.counter("answers_fail_closed") != 1 {
		t.Fatalf("degraded %d fail-closed %d", e.counter("answers_degraded"), e.counter("answers_fail_closed"))
	}
	// The emulator's wasm clock is wazero's deterministic fake, which advances on every
	// read: tick until the open period has passed (bounded), as Envoy's timer would.
	for i := 0; i < 2000 && len(e.callouts(2)) == 0; i++ {
		e.host.Tick()
	}
	e.host.Tick() // a half-open breaker sends one probe at a time
	probe := e.callouts(2)
	if len(probe) != 1 {
		t.Fatalf("half-open: want one probe, got %d", len(probe))
	}
	e.reply(t, probe[0].CalloutID, &wire.Reply{Nodes: 1, States: []wire.State{{Key: "a", Rule: "api", Lease: 20, Remaining: 70}}})
	a = e.do("/x", "x-api-key", "a")
	if a.status != 200 || a.get("x-ratelimit-policy") == "degraded" || a.get("x-ratelimit-remaining") == "-1" {
		t.Fatalf("after recovery: %d %v", a.status, a.headers)
	}
	if p := e.do("/pay", "x-api-key", "b"); p.status != 200 {
		t.Fatalf("fail-closed rule after recovery: %d", p.status)
	}
}

// Strict rules pause the request and ask the service; the answer resumes or refuses it.
func TestStrictRule(t *testing.T) {
	e := startEmu(t, syncConfig("", `{"id":"login","match":{"prefix":"/login"},"limit":5,"window":"1m","strict":true,"fail":"closed"}`))
	a := e.do("/login", "x-api-key", "u1")
	if !a.paused {
		t.Fatalf("strict request not paused: %+v", a)
	}
	// A strict check is the stream's own callout (Envoy cancels it if the request goes).
	calls := e.host.GetCalloutAttributesFromContext(a.id)
	if len(calls) != 1 || hdr(calls[0].Headers, ":path") != "/v1/check" {
		t.Fatalf("strict check callout: %+v", calls)
	}
	b := decodeBatch(t, calls[0])
	if len(b.Deltas) != 1 || b.Deltas[0].Flags&wire.FlagStrict == 0 || b.Deltas[0].Over != 1 || b.Deltas[0].Key != "u1" {
		t.Fatalf("strict batch %+v", b)
	}
	e.reply(t, calls[0].CalloutID, &wire.Reply{Nodes: 1, States: []wire.State{{Key: "u1", Rule: "login", Allowed: true, Remaining: 4, ResetInMs: 12000}}})
	if act := e.host.GetCurrentHttpStreamAction(a.id); act != types.ActionContinue {
		t.Fatalf("allowed strict request not resumed: %v", act)
	}
	if r := e.finish(a.id); r.get("x-ratelimit-remaining") != "4" {
		t.Fatalf("strict answer headers %v", r.headers)
	}

	d := e.do("/login", "x-api-key", "u1")
	c := e.host.GetCalloutAttributesFromContext(d.id)[0]
	e.reply(t, c.CalloutID, &wire.Reply{Nodes: 1, States: []wire.State{{Key: "u1", Rule: "login", Allowed: false, RetryInMs: 9000}}})
	lr := e.host.GetSentLocalResponse(d.id)
	if lr == nil || lr.StatusCode != 429 {
		t.Fatalf("refused strict request: %+v", lr)
	}
	if ra, _ := strconv.Atoi(hdr(lr.Headers, "retry-after")); ra < 9 {
		t.Fatalf("retry-after %d below the service's 9 s", ra)
	}

	// The service does not answer: the rule's fail mode (closed) answers 503.
	u := e.do("/login", "x-api-key", "u2")
	e.host.CallOnHttpCallResponse(e.host.GetCalloutAttributesFromContext(u.id)[0].CalloutID, nil, nil, nil)
	if lr := e.host.GetSentLocalResponse(u.id); lr == nil || lr.StatusCode != 503 {
		t.Fatalf("strict timeout with fail closed: %+v", lr)
	}
}

// A reply showing a newer rules version makes the filter fetch, validate and enforce it;
// a bad rule set is refused and the last good one keeps serving.
func TestHotRulesFromService(t *testing.T) {
	e := startEmu(t, syncConfig("", plainRule))
	e.do("/x", "x-api-key", "a")
	e.reply(t, e.callouts(0)[0].CalloutID, &wire.Reply{RulesVersion: 7, Nodes: 1})
	fetch := e.callouts(1)
	if len(fetch) != 1 || hdr(fetch[0].Headers, ":path") != "/v1/sync/rules" || hdr(fetch[0].Headers, ":method") != "GET" ||
		hdr(fetch[0].Headers, "authorization") != "Bearer s3cret" {
		t.Fatalf("rules fetch: %+v", fetch)
	}
	e.host.CallOnHttpCallResponse(fetch[0].CalloutID, [][2]string{{":status", "200"}, {"x-tollgate-rules-version", "7"}}, nil,
		[]byte(`{"rules":[{"id":"api","limit":3,"window":"1m"}]}`))
	if a := e.do("/x", "x-api-key", "fresh"); a.get("x-ratelimit-limit") != "3" {
		t.Fatalf("new rules not enforced: limit %q", a.get("x-ratelimit-limit"))
	}
	if v, _ := e.host.GetGaugeMetric("tollgate.rules_version"); v != 7 {
		t.Fatalf("rules_version gauge %d", v)
	}

	// Version 8 is invalid: refused, version 7 keeps serving.
	e.host.Tick()
	c := e.callouts(2)
	e.reply(t, c[0].CalloutID, &wire.Reply{RulesVersion: 8, Nodes: 1})
	f := e.callouts(3)
	e.host.CallOnHttpCallResponse(f[0].CalloutID, [][2]string{{":status", "200"}, {"x-tollgate-rules-version", "8"}}, nil,
		[]byte(`{"rules":[{"id":"api","limit":-1,"window":"1m"}]}`))
	if a := e.do("/x", "x-api-key", "fresh2"); a.get("x-ratelimit-limit") != "3" {
		t.Fatalf("a bad rule set replaced the good one: limit %q", a.get("x-ratelimit-limit"))
	}
	if e.counter("rules_rejected") != 1 {
		t.Fatal("rules_rejected not counted")
	}
	if !strings.Contains(strings.Join(e.host.GetErrorLogs(), "\n"), "rules[0].limit") {
		t.Fatalf("refusal log does not name the field: %v", e.host.GetErrorLogs())
	}
}

// The service's penalty cooldown is enforced locally until it expires.
func TestPenaltyEnforcedLocally(t *testing.T) {
	e := startEmu(t, syncConfig("", plainRule))
	e.do("/x", "x-api-key", "p")
	e.reply(t, e.callouts(0)[0].CalloutID, &wire.Reply{Nodes: 1, States: []wire.State{
		{Key: "p", Rule: "api", Lease: 50, Remaining: 40, PenaltyInMs: 8000, PenaltyLevel: 2},
	}})
	a := e.do("/x", "x-api-key", "p")
	if a.status != 429 || !strings.Contains(a.body, `"penalty_level":2`) {
		t.Fatalf("penalized key: %d %s", a.status, a.body)
	}
	if ra, _ := strconv.Atoi(a.get("retry-after")); ra < 8 {
		t.Fatalf("retry-after %d shorter than the cooldown", ra)
	}
}

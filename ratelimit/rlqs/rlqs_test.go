package rlqs

import (
	"context"
	"slices"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

const planRules = `{"rules": [
  {"id": "plan", "limit": 10, "window": "1m", "match": {"prefix": "/"},
   "descriptors": {"domain": "tollgate", "entries": [{"key": "api_key"}]}}
]}`

type client = grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]

func dial(t *testing.T, e *env, token string) client {
	t.Helper()
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	c, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func usage(bucket map[string]string, allowed, denied uint64) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: bucket},
		TimeElapsed: durationpb.New(5 * time.Second), NumRequestsAllowed: allowed, NumRequestsDenied: denied}
}

// exchange sends one report and returns the answer's action for each bucket, by the
// bucket's api_key (or "name" when it has none).
func exchange(t *testing.T, c client, rep *rlqsv3.RateLimitQuotaUsageReports) map[string]*rlqsv3.RateLimitQuotaResponse_BucketAction {
	t.Helper()
	if err := c.Send(rep); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Recv()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*rlqsv3.RateLimitQuotaResponse_BucketAction{}
	for _, a := range resp.GetBucketAction() {
		k := a.GetBucketId().GetBucket()["api_key"]
		if k == "" {
			k = a.GetBucketId().GetBucket()["name"]
		}
		out[k] = a
	}
	return out
}

// TestReportsChargeAndAssign: over one stream, a report is charged to the rule's Redis
// bucket and answered with the Envoy's share as a token bucket; a report that spends
// the bucket is answered with a deny; a bucket no rule selects is admitted; the
// service's stop expires every assignment (TTL 0) and ends the stream.
func TestReportsChargeAndAssign(t *testing.T) {
	e := start(t, Options{})
	e.putRules(t, planRules)
	c := dial(t, e, secret)
	key := uniq("k")

	got := exchange(t, c, &rlqsv3.RateLimitQuotaUsageReports{Domain: "tollgate", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		usage(map[string]string{"api_key": key}, 4, 0),
		usage(map[string]string{"name": "unlimited"}, 7, 0),
	}})
	a := got[key].GetQuotaAssignmentAction()
	tb := a.GetRateLimitStrategy().GetTokenBucket()
	if tb == nil || a.GetAssignmentTimeToLive().AsDuration() != 11*time.Second {
		t.Fatalf("assignment %v, want a token bucket living 11 s", a)
	}
	// One stream in the fleet (or none counted yet): the whole rule's rate, and at once
	// no more than the bucket still holds (10 less the 4 charged).
	if tb.GetMaxTokens() != 6 || tb.GetTokensPerFill().GetValue() != 10 || tb.GetFillInterval().AsDuration() != time.Minute {
		t.Errorf("token bucket %v, want 10 per 60 s, at most 6 at once", tb)
	}
	if r := got["unlimited"].GetQuotaAssignmentAction().GetRateLimitStrategy(); r.GetBlanketRule() != typev3.RateLimitStrategy_ALLOW_ALL || r.GetTokenBucket() != nil {
		t.Errorf("bucket no rule selects: %v, want ALLOW_ALL", r)
	}
	if n := e.consumed(t, key, "plan", 10); n != 4 {
		t.Fatalf("charged %d, want the 4 reported", n)
	}

	got = exchange(t, c, &rlqsv3.RateLimitQuotaUsageReports{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		usage(map[string]string{"api_key": key}, 8, 3),
	}})
	a = got[key].GetQuotaAssignmentAction()
	if a.GetRateLimitStrategy().GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL || a.GetRateLimitStrategy().GetTokenBucket() != nil {
		t.Fatalf("after 12 of 10: %v, want DENY_ALL", a)
	}
	if ttl := a.GetAssignmentTimeToLive().AsDuration(); ttl < time.Second || ttl > 5*time.Second {
		t.Errorf("deny TTL %v, want 1..5 s (until the bucket refills, at most a report interval)", ttl)
	}
	if n := e.consumed(t, key, "plan", 10); n != 12 {
		t.Fatalf("charged %d, want 12 (the bucket in debt)", n)
	}

	done := make(chan struct{})
	go func() { e.stop(); close(done) }()
	resp, err := c.Recv()
	if err != nil {
		t.Fatalf("no TTL-0 assignment before the stream ended: %v", err)
	}
	for _, a := range resp.GetBucketAction() {
		if ttl := a.GetQuotaAssignmentAction().GetAssignmentTimeToLive(); ttl == nil || ttl.AsDuration() != 0 {
			t.Errorf("shutdown action %v, want TTL 0", a)
		}
	}
	if len(resp.GetBucketAction()) != 2 {
		t.Errorf("shutdown expired %d buckets, want 2", len(resp.GetBucketAction()))
	}
	if _, err := c.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("stream end: %v, want Unavailable", err)
	}
	<-done
}

// TestUnauthenticated: a stream without the sync secret is refused, as the RLS path.
func TestUnauthenticated(t *testing.T) {
	e := start(t, Options{})
	e.putRules(t, planRules)
	for _, tok := range []string{"", "wrong"} {
		c := dial(t, e, tok)
		_ = c.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "tollgate"})
		if _, err := c.Recv(); status.Code(err) != codes.Unauthenticated {
			t.Errorf("token %q: %v, want Unauthenticated", tok, err)
		}
	}
}

// even is the portion of one of n Envoys of equal demand.
func even(n int64) portion { return portion{1, max(n, 1)} }

// TestShareOf: an Envoy's token bucket is its portion of the rule's rate, rounded down
// by less than 1 % (or to one permit per interval when the share is smaller), and of the
// rule's capacity, at least one permit.
func TestShareOf(t *testing.T) {
	perMin := func(limit int64) algo.Params {
		return algo.Params{Kind: algo.TokenBucket, Limit: limit, WindowUs: 60_000_000}
	}
	for _, tt := range []struct {
		name  string
		p     algo.Params
		q     portion
		burst uint32
		rate  float64 // permits a second
		exact share   // when not zero, the whole assignment
	}{
		{"one node: the rule", perMin(100), whole, 100, 100.0 / 60, share{100, 100, 60}},
		{"no portion known counts as the whole", perMin(100), portion{}, 100, 100.0 / 60, share{100, 100, 60}},
		{"four Envoys of equal demand: a quarter", perMin(100), even(4), 25, 25.0 / 60, share{}},
		{"seven tenths of the demand: seven tenths", perMin(100), portion{7, 10}, 70, 70.0 / 60, share{}},
		{"a light Envoy's 0.187 a second of 20 per 10 s is not rounded to 1 per 10 s",
			algo.Params{Kind: algo.TokenBucket, Limit: 20, WindowUs: 10_000_000}, portion{187, 2000}, 1, 0.187, share{}},
		{"share under a permit a window: a longer interval", perMin(3), even(4), 1, 0.75 / 60, share{}},
		{"a small portion of a small rule: one permit a long interval", perMin(10), portion{1, 50}, 1, 0.2 / 60, share{}},
		{"a share under a permit an hour stretches the interval", algo.Params{Kind: algo.TokenBucket, Limit: 5, WindowUs: 3_600_000_000}, portion{1, 10},
			1, 0.5 / 3600, share{1, 1, 7200}},
		{"sub-second window: whole seconds", algo.Params{Kind: algo.TokenBucket, Limit: 10, WindowUs: 100_000}, even(2), 5, 50, share{}},
		{"huge weights do not overflow", perMin(1 << 31), portion{1 << 40, 1 << 41}, 500_000_000, float64(1<<30) / 60, share{500_000_000, 1 << 30, 60}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := shareOf(tt.p, tt.q, tt.q)
			if tt.exact != (share{}) && got != tt.exact {
				t.Fatalf("shareOf(%+v, %+v) = %+v, want %+v", tt.p, tt.q, got, tt.exact)
			}
			if got.MaxTokens != tt.burst {
				t.Errorf("max_tokens %d, want %d", got.MaxTokens, tt.burst)
			}
			// Less than 1 % lost to rounding, unless the interval is already an hour.
			if r := got.rate(); r > tt.rate*(1+1e-9) || (r < tt.rate*0.99 && got.FillSec < 3600) {
				t.Errorf("rate %.5f/s (%+v), want %.5f/s, at most 1 %% less", r, got, tt.rate)
			}
			// This node's share never exceeds its portion of the rule's rate.
			q := tt.q.normalized()
			if mine := got.rate(); mine > float64(tt.p.Limit)*1e6/float64(tt.p.WindowUs)*float64(q.w)/float64(q.total)*(1+1e-9) {
				t.Errorf("rate %.3f/s above the portion %d/%d of the rule's", mine, q.w, q.total)
			}
		})
	}
}

// TestPortionFillsLikeWater: the Envoys using a key share its rule by their demand: in
// proportion while the demands fit in the rule (up to a quarter's headroom each, the
// rest evenly on top); beyond it, those asking least get their demand and the rest share
// what is left evenly. Every Envoy gets at least its demand while the demands fit, and
// the portions of the Envoys on a key never sum to more than the rule.
func TestPortionFillsLikeWater(t *testing.T) {
	perTenS := algo.Params{Kind: algo.TokenBucket, Limit: 20, WindowUs: 10_000_000} // 2/s: 2000 ×1000
	for _, tt := range []struct {
		name  string
		rates []int64 // requests a second ×1000, this Envoy's first
		want  []int64 // each Envoy's portion of 2000
	}{
		{"alone: the whole rule", []int64{1800}, []int64{2000}},
		{"alone and idle: the whole rule", []int64{0}, []int64{2000}},
		{"even client at 90 %: even shares", []int64{450, 450, 450, 450}, []int64{500, 500, 500, 500}},
		{"even client, noisy counts: in proportion", []int64{400, 500, 450, 550}, []int64{421, 526, 473, 578}},
		{"70/10/10/10 at 90 %: in proportion", []int64{1260, 180, 180, 180}, []int64{1400, 200, 200, 200}},
		{"light use: demand (the floor, 125) with headroom, the rest evenly on top", []int64{400, 100}, []int64{1172, 828}},
		{"light use, idle beside: as if it asked the floor", []int64{400, 0}, []int64{1172, 828}},
		{"an idle Envoy beside a busy one: the floor", []int64{0, 3000}, []int64{125, 1875}},
		{"over the rule: the light one gets its demand, the heavy share the rest", []int64{4000, 4000, 100}, []int64{950, 950, 100}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var sum int64
			for i := range tt.rates {
				q := seenBy(tt.rates, i).portion(perTenS)
				got := q.w * 2000 / q.total // of 2000
				if got < tt.want[i]-1 || got > tt.want[i]+1 {
					t.Errorf("Envoy %d: portion %d of 2000, want %d", i, got, tt.want[i])
				}
				if fits := slices.Max(tt.rates) > 0 && sumOf(tt.rates) <= 2000; fits && got < tt.rates[i]-1 {
					t.Errorf("Envoy %d: portion %d below its demand %d while the demands fit", i, got, tt.rates[i])
				}
				sum += q.w
			}
			if sum > portionScale {
				t.Errorf("portions sum to %d of %d, more than the rule", sum, portionScale)
			}
		})
	}
}

// seenBy is the demand Envoy i sees when the Envoys on a key ask rates (requests a
// second ×1000): its own, and every other's.
func seenBy(rates []int64, i int) demand {
	d := demand{mine: rates[i]}
	for j, r := range rates {
		if j != i {
			d.others = append(d.others, r)
		}
	}
	return d
}

func sumOf(v []int64) (s int64) {
	for _, x := range v {
		s += x
	}
	return s
}

// TestPortionOfASmallRule: a rule of 5 an hour (0.0014 permits a second) is shared as
// exactly as one of 20 per 10 s: two Envoys asking more than it get half each.
func TestPortionOfASmallRule(t *testing.T) {
	perHour := algo.Params{Kind: algo.TokenBucket, Limit: 5, WindowUs: 3_600_000_000}
	q := demand{mine: 1000, others: []int64{1000}}.portion(perHour)
	if q.w*2 != q.total {
		t.Errorf("portion %d of %d, want a half", q.w, q.total)
	}
}

// TestDemandOfAKey: the service's view of who uses a key: the last two reports of each
// stream over at least two report intervals (use.rate), streams without requests
// within two reports and a heartbeat left out.
func TestDemandOfAKey(t *testing.T) {
	s := &Server{o: Options{}.normalized(), using: map[string]map[*stream]use{}}
	a, b, idle := &stream{}, &stream{}, &stream{}
	const k, sec = "key", int64(1_000_000)
	now := 100 * sec
	s.touch(k, a, now-5*sec, 2, 5*sec)
	s.touch(k, a, now, 3, 5*sec)  // 5 in 10 s
	s.touch(k, b, now, 10, 5*sec) // new to the key: 10 in its first 5 s, none before
	if d := s.demand(k, a, now); d.mine != 500 || !slices.Equal(d.others, []int64{1000}) {
		t.Errorf("demand seen by a: %+v, want 500 and [1000]", d)
	}
	if d := s.demand(k, idle, now); d.mine != 0 || len(d.others) != 2 {
		t.Errorf("demand seen by an Envoy without requests: %+v, want 0 and both others", d)
	}
	s.touch(k, idle, now, 0, 5*sec) // a report without requests adds nobody
	if d := s.demand(k, a, now); len(d.others) != 1 {
		t.Errorf("an empty report counted a user: %+v", d)
	}
	if d := s.demand(k, a, now+12*sec); d.mine != 0 || len(d.others) != 0 {
		t.Errorf("after the horizon: %+v, want nobody", d)
	}
}

// TestSharePushedWhenAnEnvoyJoins: a second Envoy reporting requests on a key halves the
// first one's share, pushed to the first within a heartbeat (not at its next report);
// a key without requests for IdleAfter is abandoned; open streams count in the fleet.
func TestSharePushedWhenAnEnvoyJoins(t *testing.T) {
	e := start(t, Options{Heartbeat: 200 * time.Millisecond, IdleAfter: 3 * time.Second})
	e.putRules(t, `{"rules": [
  {"id": "plan", "limit": 100, "window": "1m", "match": {"prefix": "/"},
   "descriptors": {"domain": "tollgate", "entries": [{"key": "api_key"}]}}
]}`)
	key := uniq("k")
	rep := func(allowed uint64) *rlqsv3.RateLimitQuotaUsageReports {
		return &rlqsv3.RateLimitQuotaUsageReports{Domain: "tollgate", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			usage(map[string]string{"api_key": key}, allowed, 0)}}
	}
	a, b := dial(t, e, secret), dial(t, e, secret)
	if tb := exchange(t, a, rep(1))[key].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket(); tb.GetTokensPerFill().GetValue() != 100 {
		t.Fatalf("one Envoy on the key: %v, want the whole rate", tb)
	}
	if tb := exchange(t, b, rep(1))[key].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket(); tb.GetTokensPerFill().GetValue() != 50 {
		t.Fatalf("second Envoy on the key: %v, want half the rate", tb)
	}
	// a hears of it by push: one action, half the rate, no more at once than half of
	// what remained at its report (99).
	resp, err := a.Recv()
	if err != nil {
		t.Fatal(err)
	}
	tb := resp.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if tb.GetTokensPerFill().GetValue() != 50 || tb.GetMaxTokens() > 49 {
		t.Fatalf("pushed to the first Envoy: %v, want 50 a minute, at most 49 at once", tb)
	}
	// No more reports: after IdleAfter both streams abandon the key.
	for name, c := range map[string]client{"a": a, "b": b} {
		for {
			resp, err := c.Recv()
			if err != nil {
				t.Fatalf("%s: %v before an abandon", name, err)
			}
			if act := resp.GetBucketAction()[0]; act.GetAbandonAction() != nil {
				break
			}
		}
	}
	// Both streams heartbeat: the fleet size gateways hear counts them.
	out, err := e.svc.Sync(context.Background(), "test", &wire.Batch{Node: "probe"}, false)
	if err != nil || out.Nodes < 2 {
		t.Errorf("fleet size %v (%v), want the two streams counted", out, err)
	}
}

// TestRedisDownFailModes: while Redis does not take reports, a bucket of a fail-closed
// rule is answered DENY_ALL until a report is charged again; a bucket of a fail-open rule
// gets no answer (its assignment stands until its TTL, then the Envoy's
// expired_assignment_behavior decides).
func TestRedisDownFailModes(t *testing.T) {
	rs := redistest.StartStandalone(t)
	e := startOn(t, Options{}, "127.0.0.1:0", rs.Addrs())
	e.putRules(t, `{"rules": [
  {"id": "open", "limit": 10, "window": "1m", "fail": "open",
   "descriptors": {"domain": "tollgate", "entries": [{"key": "api_key"}]}},
  {"id": "closed", "limit": 10, "window": "1m", "fail": "closed",
   "descriptors": {"domain": "tollgate", "entries": [{"key": "tenant"}]}}
]}`)
	c := dial(t, e, secret)
	rep := &rlqsv3.RateLimitQuotaUsageReports{Domain: "tollgate", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		usage(map[string]string{"api_key": "a"}, 1, 0),
		usage(map[string]string{"tenant": "t"}, 1, 0),
	}}
	got := exchange(t, c, rep)
	if len(got) != 2 {
		t.Fatalf("with Redis: %d actions, want 2", len(got))
	}
	if err := rs.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.Send(rep); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resp.GetBucketAction()); n != 1 {
		t.Fatalf("Redis down: %d actions, want 1 (the fail-closed bucket only): %v", n, resp)
	}
	a := resp.GetBucketAction()[0]
	if a.GetBucketId().GetBucket()["tenant"] != "t" || a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
		t.Fatalf("Redis down: %v, want DENY_ALL for the fail-closed bucket", a)
	}
	if f := testutil.ToFloat64(e.srv.m.reports.WithLabelValues("failed")); f != 1 {
		t.Errorf("failed reports %v, want 1", f)
	}
}

// TestBurstOf: an Envoy may hold its portion of what the bucket holds, at least one
// permit while the bucket holds one for each Envoy on the key, and nothing once it does
// not (it is denied until it does).
func TestBurstOf(t *testing.T) {
	tenth := portion{1, 10}
	for _, tt := range []struct {
		name      string
		remaining int64
		q         portion
		n         int64
		want      int64
	}{
		{"its portion", 20, portion{7, 10}, 4, 14},
		{"a light Envoy's portion rounds down to nothing: one permit", 9, tenth, 4, 1},
		{"as many permits as Envoys: one each", 4, tenth, 4, 1},
		{"fewer permits than Envoys: denied", 3, tenth, 4, 0},
		{"spent", 0, whole, 1, 0},
		{"in debt", -5, whole, 1, 0},
		{"alone, one permit", 1, whole, 1, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := burstOf(tt.remaining, tt.q, tt.n); got != tt.want {
				t.Errorf("burstOf(%d, %v, %d) = %d, want %d", tt.remaining, tt.q, tt.n, got, tt.want)
			}
		})
	}
}

// TestBurstPortion: what an Envoy may hold at once goes by the square root of its part
// of the rate: even Envoys hold even bursts, a lightly used Envoy more than its part of
// the rate, and the bursts of the Envoys on a key sum to at most the bucket.
func TestBurstPortion(t *testing.T) {
	perTenS := algo.Params{Kind: algo.TokenBucket, Limit: 20, WindowUs: 10_000_000}
	for _, tt := range []struct {
		name  string
		rates []int64 // requests a second ×1000, this Envoy's first
		want  []int64 // each Envoy's burst portion, of 1000
	}{
		{"alone: all of it", []int64{1800}, []int64{1000}},
		{"even: even", []int64{450, 450, 450, 450}, []int64{250, 250, 250, 250}},
		// rate parts 0.7 and 0.1: √0.7 / (√0.7 + 3·√0.1) and √0.1 / (…)
		{"70/10/10/10: the light ones a sixth each", []int64{1260, 180, 180, 180}, []int64{468, 177, 177, 177}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var sum int64
			for i := range tt.rates {
				q := seenBy(tt.rates, i).burstPortion(perTenS)
				if got := q.w * 1000 / q.total; got < tt.want[i]-1 || got > tt.want[i]+1 {
					t.Errorf("Envoy %d: burst portion %d of 1000, want %d", i, got, tt.want[i])
				}
				sum += q.w
			}
			if sum > portionScale {
				t.Errorf("burst portions sum to %d of %d, more than the bucket", sum, portionScale)
			}
		})
	}
}

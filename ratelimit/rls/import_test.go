package rls

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-rl/tollgate/ratelimit/rlsimport"
)

// TestImportedEnvoyRateLimitConfig: ratelimit/rlsimport's fixture (an envoyproxy/ratelimit
// configuration), converted and made the service's rule set, answers a request sequence
// through ShouldRateLimit (a real gRPC client, real Redis) as envoyproxy/ratelimit
// answers it under that configuration. The expected answers are derived from its
// semantics, step by step:
//
//   - a descriptor walks the tree entry by entry, taking the child with its key and
//     value, else the child with its key alone, never going back; the limit of the node
//     it ends on after its last entry applies, nothing else;
//   - counters are per domain and descriptor values, in fixed windows of the unit;
//   - unlimited and unmatched descriptors are OK without a current limit; shadow limits
//     count but answer OK;
//   - a limit that replaces a name switches the limits of that name off for the whole
//     request (they are neither checked nor counted);
//   - the overall code is OVER_LIMIT when any descriptor is.
func TestImportedEnvoyRateLimitConfig(t *testing.T) {
	data, err := os.ReadFile("../rlsimport/testdata/envoy-ratelimit.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// A domain of its own per run: the fixture's valued descriptors (user vip, tenant
	// acme) would otherwise share buckets with earlier runs on the same Redis.
	domain := uniq("edge")
	data = []byte(strings.Replace(string(data), "\ndomain: edge\n", "\ndomain: "+domain+"\n", 1))
	res := rlsimport.Convert(data)
	if len(res.Problems) > 0 {
		t.Fatalf("conversion problems: %v", res.Problems)
	}
	e := start(t, opts{})
	e.putRules(t, string(res.Rules))

	// Values the configuration names stay; every other value is made unique per run.
	fixed := map[string]bool{"vip": true, "robot": true, "/search": true, "/upload": true, "acme": true}
	val := func(v string) string {
		if fixed[v] {
			return v
		}
		return v + "-" + domain
	}
	const ok, over = "OK", "OVER_LIMIT"
	type step struct {
		name  string
		descs []string // each "key=value,key=value"
		times int      // the step repeated (default 1)
		want  []string // per descriptor
		limit []string // per descriptor: the current limit ("3/MINUTE"), "" for none
	}
	steps := []step{
		{"any user: first of 3 a minute", []string{"user=bob"}, 2, []string{ok}, []string{"3/MINUTE"}},
		{"upload replaces per_user: only the upload limit counts", []string{"user=bob", "path=/upload,user=bob"}, 1, []string{ok, ok}, []string{"", "1/DAY"}},
		{"per_user was not counted by the upload request", []string{"user=bob"}, 1, []string{ok}, []string{"3/MINUTE"}},
		{"fourth per_user request is over", []string{"user=bob"}, 1, []string{over}, []string{"3/MINUTE"}},
		{"per_user is over but replaced; the second upload is over", []string{"user=bob", "path=/upload,user=bob"}, 1, []string{ok, over}, []string{"", "1/DAY"}},
		{"another user's upload", []string{"user=carol", "path=/upload,user=carol"}, 1, []string{ok, ok}, []string{"", "1/DAY"}},
		{"vip is not the any-user limit's: 5 an hour", []string{"user=vip"}, 5, []string{ok}, []string{"5/HOUR"}},
		{"vip's sixth is over", []string{"user=vip"}, 1, []string{over}, []string{"5/HOUR"}},
		{"robot is unlimited", []string{"user=robot"}, 6, []string{ok}, []string{""}},
		{"/search alone ends on a node without a limit", []string{"path=/search"}, 4, []string{ok}, []string{""}},
		{"any other path: 2 a minute", []string{"path=/other"}, 2, []string{ok}, []string{"2/MINUTE"}},
		{"any other path: third is over", []string{"path=/other"}, 1, []string{over}, []string{"2/MINUTE"}},
		{"per user on /search: 2 a minute, whatever per_user says", []string{"path=/search,user=bob"}, 2, []string{ok}, []string{"2/MINUTE"}},
		{"per user on /search: third is over", []string{"path=/search,user=bob"}, 1, []string{over}, []string{"2/MINUTE"}},
		{"the any-path node has no children: no limit for path and user", []string{"path=/other,user=bob"}, 4, []string{ok}, []string{""}},
		{"tenant and user: 2 an hour", []string{"tenant=globex,user=dan"}, 2, []string{ok}, []string{"2/HOUR"}},
		{"tenant and user: third is over", []string{"tenant=globex,user=dan"}, 1, []string{over}, []string{"2/HOUR"}},
		{"acme's users: the walk takes tenant acme and never goes back", []string{"tenant=acme,user=dan"}, 4, []string{ok}, []string{""}},
		{"tenant acme: 4 an hour for the tenant", []string{"tenant=acme"}, 4, []string{ok}, []string{"4/HOUR"}},
		{"tenant acme: fifth is over", []string{"tenant=acme"}, 1, []string{over}, []string{"4/HOUR"}},
		// envoyproxy/ratelimit also reports a shadow limit as the current limit; Tollgate
		// keeps shadow rules out of what callers see (no current limit, no headers).
		{"shadow: never over", []string{"client=c1"}, 3, []string{ok}, []string{""}},
		{"longer than any path: no limit", []string{"user=erin,extra=x"}, 4, []string{ok}, []string{""}},
		{"one over descriptor makes the request over", []string{"path=/other", "user=frank"}, 1, []string{over, ok}, []string{"2/MINUTE", "3/MINUTE"}},
	}
	// The sequence must run inside one minute window (the per-minute limits); it takes
	// well under a second.
	if left := time.Minute - time.Duration(time.Now().UnixNano())%time.Minute; left < 5*time.Second {
		time.Sleep(left)
	}
	for _, s := range steps {
		req := &rlsv3.RateLimitRequest{Domain: domain}
		for _, d := range s.descs {
			pd := &commonv3.RateLimitDescriptor{}
			for _, kv := range strings.Split(d, ",") {
				k, v, _ := strings.Cut(kv, "=")
				pd.Entries = append(pd.Entries, &commonv3.RateLimitDescriptor_Entry{Key: k, Value: val(v)})
			}
			req.Descriptors = append(req.Descriptors, pd)
		}
		for n := 1; n <= max(s.times, 1); n++ {
			resp, err := e.call(t, secret, req)
			if err != nil {
				t.Fatalf("%s (#%d): %v", s.name, n, err)
			}
			wantOverall := ok
			for _, w := range s.want {
				if w == over {
					wantOverall = over
				}
			}
			var got, gotLimit []string
			for _, st := range resp.Statuses {
				got = append(got, st.Code.String())
				l := ""
				if st.CurrentLimit != nil {
					l = fmt.Sprintf("%d/%s", st.CurrentLimit.RequestsPerUnit, st.CurrentLimit.Unit)
				}
				gotLimit = append(gotLimit, l)
			}
			if resp.OverallCode.String() != wantOverall || fmt.Sprint(got) != fmt.Sprint(s.want) || fmt.Sprint(gotLimit) != fmt.Sprint(s.limit) {
				t.Errorf("%s (#%d): overall %s statuses %v limits %v, want %s %v %v",
					s.name, n, resp.OverallCode, got, gotLimit, wantOverall, s.want, s.limit)
			}
		}
	}
}

package service

import (
	"math/big"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/rule"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// boundWindow is one window of a rule set at the algorithms' bounds.
type boundWindow struct {
	limit, windowUs, burst int64
}

func (w boundWindow) json() string {
	s := `{"limit":` + strconv.FormatInt(w.limit, 10) + `,"window":` + strconv.FormatInt(w.windowUs/1000, 10)
	if w.burst > 0 {
		s += `,"burst":` + strconv.FormatInt(w.burst, 10)
	}
	return s + `}`
}

// maxBurst is the largest burst algo.Params.Validate allows a window: algo.MaxBurst, or
// less where a bucket that large would take longer than algo.MaxRefillUs to refill.
func maxBurst(limit, windowUs int64) int64 {
	m := new(big.Int).Mul(big.NewInt(algo.MaxRefillUs), big.NewInt(limit))
	m.Quo(m, big.NewInt(windowUs))
	if m.IsInt64() && m.Int64() < algo.MaxBurst {
		return m.Int64()
	}
	return algo.MaxBurst
}

// boundRules is a rule set with one rule per algorithm whose windows sit on the bounds:
// limit 1 and the maximum, the shortest and the longest window, one permit per µs,
// the maximum burst (token_bucket, gcra) and the maximum cost.
func boundRules() string {
	var rules []string
	for _, kind := range rule.Algorithms() {
		maxLimit := kind.MaxLimit()
		ws := []boundWindow{
			{1, algo.MinWindowUs, 0},
			{algo.MinWindowUs, algo.MinWindowUs, 0}, // one permit per µs
			{1, algo.MaxWindowUs, 0},
			{maxLimit, algo.MaxWindowUs, 0},
			{maxLimit, max(algo.MinWindowUs, (maxLimit+999)/1000*1000), 0}, // the largest limit on its shortest window
		}
		if kind.HasBurst() {
			ws = append(ws,
				boundWindow{maxLimit, algo.MaxWindowUs, maxBurst(maxLimit, algo.MaxWindowUs)},
				boundWindow{1, algo.MaxWindowUs, maxBurst(1, algo.MaxWindowUs)},
				boundWindow{1, algo.MinWindowUs, maxBurst(1, algo.MinWindowUs)})
		}
		var parts []string
		for _, w := range ws {
			parts = append(parts, w.json())
		}
		rules = append(rules, `{"id":"b-`+kind.String()+`","algorithm":"`+kind.String()+`","cost":`+strconv.Itoa(algo.MaxCost)+
			`,"windows":[`+strings.Join(parts, ",")+`]}`)
	}
	return `{"rules":[` + strings.Join(rules, ",") + `]}`
}

// TestRulesAtBounds: a rule set on every bound of every algorithm is accepted by the
// admin API, and a gateway's delta for each of its windows is charged, none refused;
// a rule set one step past a bound is answered 422 naming the field, and the previous
// version keeps serving (GET and the sync replies).
func TestRulesAtBounds(t *testing.T) {
	srv := redistest.StartStandalone(t)
	in := start(t, opts{addrs: srv.Addrs()})
	body := boundRules()
	pushRules(t, in, body)
	_, _, served := in.do(t, http.MethodGet, "/v1/rules", adminToken, nil)
	cfg, err := rule.Parse(served)
	if err != nil {
		t.Fatalf("served rules: %v", err)
	}
	good := cfg.Version

	t.Run("every window charges", func(t *testing.T) {
		var deltas []wire.Delta
		var params []algo.Params
		for _, r := range cfg.Rules {
			for i, p := range r.Windows {
				d := wire.Delta{Key: uniq("bound"), Rule: r.ID, Window: uint8(i), Over: 1, ElapsedMs: 100}
				setParams(&d, p)
				deltas = append(deltas, d)
				params = append(params, p)
			}
		}
		rep := in.sync(t, "/v1/sync", &wire.Batch{Node: "gw", Seq: uint64(time.Now().UnixMicro()), Deltas: deltas})
		if rep.RulesVersion != good {
			t.Errorf("reply carries rules version %d, want %d", rep.RulesVersion, good)
		}
		for i, st := range rep.States {
			capa := params[i].Capacity()
			if st.Flags&wire.StateRefused != 0 {
				t.Errorf("%s window %d %+v refused: %s", deltas[i].Rule, deltas[i].Window, params[i], st.Reason)
				continue
			}
			// One permit charged on a fresh bucket: what is left, leases included, is at
			// most the capacity less one.
			if left := st.Remaining + int64(st.Lease); left > capa-1 || left < 0 {
				t.Errorf("%s window %d %+v: remaining %d + lease %d after charging 1 of %d", deltas[i].Rule, deltas[i].Window, params[i], st.Remaining, st.Lease, capa)
			}
		}
	})

	over := func(v int64) string { return strconv.FormatInt(v, 10) }
	unenforceable := []struct {
		name, body, field string
	}{
		{"limit above the maximum", `{"rules":[{"id":"a","limit":` + over(algo.MaxLimit+1) + `,"window":` + over(algo.MaxWindowUs/1000) + `}]}`, "rules[0].limit"},
		{"log limit above its maximum", `{"rules":[{"id":"a","algorithm":"sliding_window_log","limit":` + over(algo.MaxLogLimit+1) + `,"window":` + over(algo.MaxWindowUs/1000) + `}]}`, "rules[0].limit"},
		{"window above the maximum", `{"rules":[{"id":"a","limit":1,"window":` + over(algo.MaxWindowUs/1000+1) + `}]}`, "rules[0].window"},
		{"window below the minimum", `{"rules":[{"id":"a","limit":1,"window":"` + strconv.FormatInt(algo.MinWindowUs-1, 10) + `us"}]}`, "rules[0].window"},
		{"more than one permit per µs", `{"rules":[{"id":"a","algorithm":"fixed_window","limit":` + over(algo.MinWindowUs+1) + `,"window":` + over(algo.MinWindowUs/1000) + `}]}`, "rules[0].limit"},
		{"burst above the maximum", `{"rules":[{"id":"a","algorithm":"gcra","limit":1,"window":"1s","burst":` + over(algo.MaxBurst+1) + `}]}`, "rules[0].burst"},
		{"burst that takes too long to refill", `{"rules":[{"id":"a","limit":1,"window":` + over(algo.MaxWindowUs/1000) + `,"burst":` + over(maxBurst(1, algo.MaxWindowUs)+1) + `}]}`, "rules[0].burst"},
		{"cost above the maximum", `{"rules":[{"id":"a","limit":1,"window":"1s","cost":` + over(algo.MaxCost+1) + `}]}`, "rules[0].cost"},
		{"tier window", `{"tiers":[{"name":"pro","keys":["p*"]}],"rules":[{"id":"a","limit":1,"window":"1s","tiers":{"pro":{"windows":[{"limit":1,"window":"1s"},{"limit":` + over(algo.MaxLimit+1) + `,"window":"1s"}]}}}]}`, "rules[0].tiers.pro.windows[1].limit"},
		{"override window", `{"rules":[{"id":"a","limit":1,"window":"1s","overrides":[{"key":"k*","limit":1,"window":` + over(algo.MaxWindowUs/1000+1) + `}]}]}`, "rules[0].overrides[0].window"},
	}
	for _, tt := range unenforceable {
		t.Run("refused/"+tt.name, func(t *testing.T) {
			code, _, out := in.do(t, http.MethodPut, "/v1/rules", adminToken, []byte(tt.body))
			var eb struct {
				Field  string
				Error  string
				Errors []struct{ Field, Error string }
			}
			decodeJSON(t, out, &eb)
			if code != http.StatusUnprocessableEntity || eb.Field != tt.field || len(eb.Errors) != 1 || eb.Errors[0].Field != tt.field ||
				!strings.HasPrefix(eb.Error, tt.field+": ") {
				t.Fatalf("PUT: %d %s, want 422 naming %s", code, out, tt.field)
			}
			code, hdr, got := in.do(t, http.MethodGet, "/v1/rules", adminToken, nil)
			if v, _ := parsedRules(t, got); code != http.StatusOK || v != good || hdr.Get(RulesVersionHeader) != strconv.FormatUint(good, 10) {
				t.Fatalf("after a refused PUT: %d, version %d, want %d", code, v, good)
			}
			d := wire.Delta{Key: uniq("still"), Rule: "b-token_bucket", Over: 1}
			setParams(&d, cfg.Rules[0].Windows[0])
			if r := in.sync(t, "/v1/sync", &wire.Batch{Node: "gw", Seq: uint64(time.Now().UnixMicro()), Deltas: []wire.Delta{d}}); r.RulesVersion != good || r.States[0].Flags&wire.StateRefused != 0 {
				t.Fatalf("sync after a refused PUT: version %d, state %+v", r.RulesVersion, r.States[0])
			}
		})
	}
}

package rule

import (
	"strconv"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

// The levers' fixtures join parseErrorCases, so TestParseErrors checks them and
// TestParseErrorFixturesListed keeps them in step with testdata/.
func init() {
	for _, c := range []struct{ fixture, field, msg string }{
		{"bad_enforcement.json", "enforcement", `must be "on", "shadow" or "off", got "paused"`},
		{"bad_key_hashing.json", "key_hashing", `must be "ip", "all" or "off", got "sometimes"`},
		{"degraded_limit_above_limit.json", "rules[1].degraded_limit", "must be <= the rule's limit (10), got 50"},
		{"degraded_limit_zero.json", "rules[0].degraded_limit", "must be > 0, got 0"},
		{"degraded_limit_not_integer.json", "rules[0].degraded_limit", `must be an integer, got "5"`},
		{"rollout_percent_above_100.json", "rules[0].rollout_percent", "must be <= 100, got 101"},
		{"rollout_percent_three_decimals.json", "rules[0].rollout_percent", "at most two decimals, got 12.345"},
		{"rollout_percent_negative.json", "rules[0].rollout_percent", "must be a number from 0 to 100 with at most two decimals, got -5"},
		{"rollout_percent_not_number.json", "rules[0].rollout_percent", `must be a number from 0 to 100, got "10%"`},
	} {
		parseErrorCases = append(parseErrorCases, struct {
			fixture string
			field   string
			msg     string
		}{c.fixture, c.field, c.msg})
	}
}

func TestParseLevers(t *testing.T) {
	tests := []struct {
		name        string
		doc         string
		enforcement Enforcement
		hashing     KeyHashing
		degraded    int64
		shadowBP    int64
	}{
		{"defaults", `{"rules":[{"id":"a","limit":10,"window":"1s"}]}`, EnforceOn, HashIPKeys, 0, 0},
		{"enforcement on", `{"enforcement":"on","rules":[{"id":"a","limit":10,"window":"1s"}]}`, EnforceOn, HashIPKeys, 0, 0},
		{"enforcement shadow", `{"enforcement":"shadow","rules":[{"id":"a","limit":10,"window":"1s"}]}`, EnforceShadow, HashIPKeys, 0, 0},
		{"enforcement off", `{"enforcement":"off","rules":[{"id":"a","limit":10,"window":"1s"}]}`, EnforceOff, HashIPKeys, 0, 0},
		{"hash all", `{"key_hashing":"all","rules":[{"id":"a","limit":10,"window":"1s"}]}`, EnforceOn, HashAllKeys, 0, 0},
		{"hash off", `{"key_hashing":"off","rules":[{"id":"a","limit":10,"window":"1s"}]}`, EnforceOn, HashNoKeys, 0, 0},
		{"degraded limit", `{"rules":[{"id":"a","limit":10,"window":"1s","degraded_limit":3}]}`, EnforceOn, HashIPKeys, 3, 0},
		{"degraded limit equal", `{"rules":[{"id":"a","limit":10,"window":"1s","degraded_limit":10}]}`, EnforceOn, HashIPKeys, 10, 0},
		{"rollout 10", `{"rules":[{"id":"a","limit":10,"window":"1s","rollout_percent":10}]}`, EnforceOn, HashIPKeys, 0, 9000},
		{"rollout 0", `{"rules":[{"id":"a","limit":10,"window":"1s","rollout_percent":0}]}`, EnforceOn, HashIPKeys, 0, 10000},
		{"rollout 100", `{"rules":[{"id":"a","limit":10,"window":"1s","rollout_percent":100}]}`, EnforceOn, HashIPKeys, 0, 0},
		{"rollout 100.0", `{"rules":[{"id":"a","limit":10,"window":"1s","rollout_percent":100.0}]}`, EnforceOn, HashIPKeys, 0, 0},
		{"rollout 12.5", `{"rules":[{"id":"a","limit":10,"window":"1s","rollout_percent":12.5}]}`, EnforceOn, HashIPKeys, 0, 8750},
		{"rollout 0.01", `{"rules":[{"id":"a","limit":10,"window":"1s","rollout_percent":0.01}]}`, EnforceOn, HashIPKeys, 0, 9999},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustParse(t, tt.doc)
			r := &c.Rules[0]
			if c.Enforcement != tt.enforcement || c.KeyHashing != tt.hashing || r.DegradedLimit != tt.degraded || r.ShadowBP != tt.shadowBP {
				t.Fatalf("enforcement %v hashing %v degraded %d shadowBP %d, want %v %v %d %d",
					c.Enforcement, c.KeyHashing, r.DegradedLimit, r.ShadowBP, tt.enforcement, tt.hashing, tt.degraded, tt.shadowBP)
			}
		})
	}
}

func TestShadowed(t *testing.T) {
	enforced, shadow := &Rule{ID: "a"}, &Rule{ID: "a", Shadow: true}
	none, all := &Rule{ID: "a", ShadowBP: 10000}, &Rule{ID: "a", ShadowBP: 0}
	tests := []struct {
		name string
		cfg  *Config
		rule *Rule
		want bool
	}{
		{"on, enforced rule", &Config{}, enforced, false},
		{"on, shadow rule", &Config{}, shadow, true},
		{"shadow, enforced rule", &Config{Enforcement: EnforceShadow}, enforced, true},
		{"off is not shadow", &Config{Enforcement: EnforceOff}, enforced, false},
		{"rollout 0 %", &Config{}, none, true},
		{"rollout 100 %", &Config{}, all, false},
		{"nil config", nil, enforced, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.cfg.Shadowed(&Applied{Rule: tt.rule, Key: "alice"}); got != tt.want {
				t.Fatalf("Shadowed = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestRolloutShare: a rollout enforces its share of keys (10,000 IPs) within ±1 point,
// the enforced set only grows as the percentage does, and another rule id picks
// another set.
func TestRolloutShare(t *testing.T) {
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = "10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
	}
	prev := map[string]bool{}
	for _, pct := range []int64{1, 5, 10, 50, 90} {
		t.Run(strconv.FormatInt(pct, 10)+"%", func(t *testing.T) {
			r := &Rule{ID: "search", ShadowBP: 10000 - pct*100}
			cur := map[string]bool{}
			for _, k := range keys {
				if r.RolledOut(k) {
					cur[k] = true
				}
			}
			if got := float64(len(cur)) / float64(len(keys)) * 100; got < float64(pct)-1 || got > float64(pct)+1 {
				t.Errorf("enforced on %.2f %% of keys, want %d ± 1", got, pct)
			}
			for k := range prev {
				if !cur[k] {
					t.Fatalf("key %s enforced at a lower percentage is shadowed at %d %%", k, pct)
				}
			}
			prev = cur
		})
	}
	same := 0
	a, b := &Rule{ID: "a", ShadowBP: 9000}, &Rule{ID: "b", ShadowBP: 9000}
	for _, k := range keys {
		if a.RolledOut(k) && b.RolledOut(k) {
			same++
		}
	}
	if same > 300 { // independent 10 % sets share about 1 % (100 keys)
		t.Errorf("rules a and b enforce %d of the same keys: the rule id does not spread them", same)
	}
}

func TestDegradedWindow(t *testing.T) {
	tb := algo.TokenBucket
	tests := []struct {
		name  string
		p     algo.Params
		limit int64
		want  algo.Params
	}{
		{"unset", algo.Params{Kind: tb, Limit: 100, WindowUs: 1e6}, 0, algo.Params{Kind: tb, Limit: 100, WindowUs: 1e6}},
		{"lower", algo.Params{Kind: tb, Limit: 100, WindowUs: 1e6}, 20, algo.Params{Kind: tb, Limit: 20, WindowUs: 1e6}},
		{"burst capped", algo.Params{Kind: tb, Limit: 100, WindowUs: 1e6, Burst: 150}, 20, algo.Params{Kind: tb, Limit: 20, WindowUs: 1e6, Burst: 20}},
		{"burst below kept", algo.Params{Kind: tb, Limit: 100, WindowUs: 1e6, Burst: 10}, 20, algo.Params{Kind: tb, Limit: 20, WindowUs: 1e6, Burst: 10}},
		{"above the limit", algo.Params{Kind: tb, Limit: 10, WindowUs: 1e6}, 20, algo.Params{Kind: tb, Limit: 10, WindowUs: 1e6}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DegradedWindow(tt.p, tt.limit); got != tt.want {
				t.Fatalf("DegradedWindow = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestRolloutPointAllocs(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _ = RolloutPoint("search", "203.0.113.7") }); n != 0 {
		t.Fatalf("RolloutPoint allocates %.0f times", n)
	}
}

// checkLevers is the levers' part of checkInvariants (the fuzz target's oracle).
func checkLevers(t testing.TB, c *Config) {
	t.Helper()
	if c.Enforcement > EnforceOff || c.KeyHashing > HashNoKeys {
		t.Fatalf("enforcement %d key hashing %d", c.Enforcement, c.KeyHashing)
	}
	for i := range c.Rules {
		r := &c.Rules[i]
		if r.ShadowBP < 0 || r.ShadowBP > 10000 || r.DegradedLimit < 0 {
			t.Fatalf("rule %q: shadowBP %d degraded %d", r.ID, r.ShadowBP, r.DegradedLimit)
		}
		for _, w := range r.Windows {
			if err := r.Degraded(w).Validate(); err != nil {
				t.Fatalf("rule %q: degraded window %+v: %v", r.ID, r.Degraded(w), err)
			}
		}
	}
}

package rule

import (
	"reflect"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

// headers builds a Request.Header from name/value pairs (names lower-case).
func headers(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}

// unindexed returns a copy of c without Parse's indexes, so the same cases exercise the
// linear-scan path a hand-built Config takes.
func unindexed(c *Config) *Config {
	u := *c
	u.allowIdx, u.denyIdx, u.tierIdx, u.byID = nil, nil, nil, nil
	u.Rules = append([]Rule(nil), c.Rules...)
	for i := range u.Rules {
		u.Rules[i].overrideIdx = nil
	}
	return &u
}

func bothConfigs(t *testing.T, doc string) map[string]*Config {
	c := mustParse(t, doc)
	return map[string]*Config{"indexed": c, "unindexed": unindexed(c)}
}

const precedenceDoc = `{
  "tiers": [
    {"name": "enterprise", "keys": ["sk_ent_*"]},
    {"name": "pro", "header": "x-plan", "values": ["pro", "pro-annual"]},
    {"name": "free", "keys": ["sk_free_*"]}
  ],
  "rules": [{
    "id": "api", "limit": 10, "window": "1m",
    "tiers": {"pro": {"limit": 1000, "window": "1m"}, "enterprise": {"windows": [{"limit": 100, "window": "1s"}, {"limit": 10000, "window": "1m"}]}},
    "overrides": [
      {"key": "sk_live_big*", "limit": 5000, "window": "1m"},
      {"key": "sk_live_big_special", "limit": 1, "window": "1s"},
      {"key": "sk_ent_vip", "limit": 7, "window": "1m"}
    ]
  }]
}`

func TestApplyPrecedence(t *testing.T) {
	tb := algo.TokenBucket
	tests := []struct {
		name    string
		key     string
		plan    string
		windows []algo.Params
		tier    string
	}{
		{"override", "sk_live_big1", "", []algo.Params{win(tb, 5000, "1m", 0)}, ""},
		{"first override in config order", "sk_live_big_special", "", []algo.Params{win(tb, 5000, "1m", 0)}, ""},
		{"override beats tier", "sk_ent_vip", "", []algo.Params{win(tb, 7, "1m", 0)}, ""},
		{"tier by key", "sk_ent_1", "", []algo.Params{win(tb, 100, "1s", 0), win(tb, 10000, "1m", 0)}, "enterprise"},
		{"tier by header", "sk_x", "pro-annual", []algo.Params{win(tb, 1000, "1m", 0)}, "pro"},
		{"first tier definition wins", "sk_ent_2", "pro", []algo.Params{win(tb, 100, "1s", 0), win(tb, 10000, "1m", 0)}, "enterprise"},
		{"header value must match exactly", "sk_x", "Pro", []algo.Params{win(tb, 10, "1m", 0)}, ""},
		{"tier without rule limits uses default", "sk_free_1", "", []algo.Params{win(tb, 10, "1m", 0)}, ""},
		{"default", "sk_x", "", []algo.Params{win(tb, 10, "1m", 0)}, ""},
	}
	for cname, c := range bothConfigs(t, precedenceDoc) {
		for _, tt := range tests {
			t.Run(cname+"/"+tt.name, func(t *testing.T) {
				kv := []string{"x-api-key", tt.key}
				if tt.plan != "" {
					kv = append(kv, "x-plan", tt.plan)
				}
				got := c.Apply(&Request{Method: "GET", Path: "/", Header: headers(kv...)}, nil)
				if len(got) != 1 {
					t.Fatalf("%d rules applied", len(got))
				}
				a := got[0]
				if a.Key != tt.key || a.Tier != tt.tier || a.Cost != 1 || a.Rule != &c.Rules[0] || !reflect.DeepEqual(a.Windows, tt.windows) {
					t.Errorf("got %+v, want key %q tier %q windows %+v", a, tt.key, tt.tier, tt.windows)
				}
			})
		}
	}
}

func TestApplyCosts(t *testing.T) {
	c := mustParse(t, `{"rules":[{"id":"api","limit":100,"window":"1m","cost":2,
		"costs":[{"prefix":"/embed","cost":10},{"regex":"^/embed/big","cost":50},{"regex":"^/batch","cost":5}]}]}`)
	tests := []struct {
		path string
		cost int64
	}{
		{"/embed", 10},
		{"/embed/big", 10}, // the first matching entry wins, not the most specific
		{"/embedding", 2},  // prefixes match whole segments
		{"/batch/1", 5},
		{"/v1/../embed/x", 10},
		{"/other", 2},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			got := c.Apply(&Request{Path: tt.path, Header: headers("x-api-key", "k")}, nil)
			if len(got) != 1 || got[0].Cost != tt.cost {
				t.Errorf("got %+v, want cost %d", got, tt.cost)
			}
		})
	}
}

const matchDoc = `{"rules":[
  {"id":"global","limit":1000,"window":"1m"},
  {"id":"search","limit":30,"window":"1m","match":{"prefix":"/search","methods":["GET","head"]}},
  {"id":"users","limit":100,"window":"1m","match":{"prefix":"/users/"}},
  {"id":"org","limit":50,"window":"1m","match":{"hosts":["*.example.org","[::1]"]}},
  {"id":"versioned","limit":5,"window":"1s","match":{"regex":"^/v[0-9]+/search"}},
  {"id":"writes","limit":5,"window":"1s","match":{"methods":["POST","PUT"]}},
  {"id":"per-user","limit":5,"window":"1s","key":{"source":"header","name":"x-user"}},
  {"id":"all-of","limit":5,"window":"1s","match":{"prefix":"/search","methods":["GET"],"hosts":["api.example.com"],"regex":"/deep$"}}
]}`

func TestApplyMatching(t *testing.T) {
	tests := []struct {
		name   string
		req    Request
		wantID []string
	}{
		{"prefix method and host", Request{Method: "GET", Host: "api.example.org", Path: "/search?q=1"}, []string{"global", "search", "org"}},
		{"host case, port and regex", Request{Method: "GET", Host: "API.EXAMPLE.ORG:8443", Path: "/v2/search"}, []string{"global", "org", "versioned"}},
		{"methods are case-insensitive", Request{Method: "head", Path: "/search"}, []string{"global", "search"}},
		{"other method", Request{Method: "POST", Path: "/search"}, []string{"global", "writes"}},
		{"glob needs a subdomain", Request{Method: "GET", Host: "example.org", Path: "/users"}, []string{"global", "users"}},
		{"trailing-dot host", Request{Method: "GET", Host: "a.example.org.", Path: "/"}, []string{"global", "org"}},
		{"ipv6 literal host", Request{Method: "GET", Host: "[::1]:8080", Path: "/"}, []string{"global", "org"}},
		{"path normalised before matching", Request{Method: "GET", Path: "//search/./x/"}, []string{"global", "search"}},
		{"encoded path normalised", Request{Method: "GET", Path: "/%73earch"}, []string{"global", "search"}},
		{"whole segments only", Request{Method: "GET", Path: "/searching"}, []string{"global"}},
		{"missing key skips the rule", Request{Method: "GET", Path: "/"}, []string{"global"}},
		{"per-rule key present", Request{Method: "GET", Path: "/", Header: headers("x-user", "u1")}, []string{"global", "per-user"}},
		{"every condition must hold", Request{Method: "GET", Host: "api.example.com", Path: "/search/deep"}, []string{"global", "search", "all-of"}},
		{"one condition fails", Request{Method: "GET", Host: "api.example.net", Path: "/search/deep"}, []string{"global", "search"}},
	}
	for cname, c := range bothConfigs(t, matchDoc) {
		for _, tt := range tests {
			t.Run(cname+"/"+tt.name, func(t *testing.T) {
				req := tt.req
				req.PeerAddr = "203.0.113.9:5555"
				var ids []string
				for _, a := range c.Apply(&req, nil) {
					ids = append(ids, a.Rule.ID)
					want := "203.0.113.9"
					if a.Rule.ID == "per-user" {
						want = "u1"
					}
					if a.Key != want {
						t.Errorf("rule %s key %q, want %q", a.Rule.ID, a.Key, want)
					}
				}
				if !reflect.DeepEqual(ids, tt.wantID) {
					t.Errorf("applied %v, want %v", ids, tt.wantID)
				}
			})
		}
	}
}

func TestApplyNil(t *testing.T) {
	var c *Config
	if got := c.Apply(&Request{}, nil); got != nil {
		t.Errorf("nil config applied %v", got)
	}
	c = mustParse(t, matchDoc)
	if got := c.Apply(nil, nil); got != nil {
		t.Errorf("nil request applied %v", got)
	}
	// A Request without a Header func still gets IP keys.
	if got := c.Apply(&Request{Path: "/", PeerAddr: "10.0.0.1"}, nil); len(got) != 1 || got[0].Key != "10.0.0.1" {
		t.Errorf("got %+v", got)
	}
}

func TestApplyHandBuiltConfig(t *testing.T) {
	// No DefaultKey, no indexes, Cost 0: Apply falls back to the built-in default key and
	// cost 1.
	c := &Config{Rules: []Rule{{ID: "r", Windows: []algo.Params{{Limit: 1, WindowUs: 1e6}}}}}
	got := c.Apply(&Request{Path: "/", Header: headers("x-api-key", "k1"), PeerAddr: "10.0.0.1"}, nil)
	if len(got) != 1 || got[0].Key != "k1" || got[0].Cost != 1 {
		t.Errorf("got %+v", got)
	}
	got = c.Apply(&Request{Path: "/", PeerAddr: "10.0.0.1"}, got[:0])
	if len(got) != 1 || got[0].Key != "10.0.0.1" {
		t.Errorf("got %+v", got)
	}
	if c.RuleByID("r") != &c.Rules[0] || c.RuleByID("x") != nil {
		t.Error("RuleByID on a hand-built config")
	}
}

func TestApplyAllocations(t *testing.T) {
	c := mustParse(t, `{
	  "tiers":[{"name":"pro","keys":["sk_pro_*"]}],
	  "rules":[
	    {"id":"global","limit":1000,"window":"1m","key":{"source":"ip","trusted_hops":1}},
	    {"id":"search","limit":30,"window":"1m","match":{"prefix":"/search","methods":["GET"],"hosts":["*.example.com"]},
	     "tiers":{"pro":{"limit":300,"window":"1m"}},"overrides":[{"key":"sk_big","limit":5000,"window":"1m"}],
	     "costs":[{"prefix":"/search/deep","cost":5}]},
	    {"id":"route","limit":10,"window":"1s","key":{"source":"route"}}
	  ]}`)
	req := &Request{Method: "GET", Host: "api.example.com:443", Path: "/search/deep", PeerAddr: "10.0.0.1:1234",
		Header: headers("x-api-key", "sk_pro_1", "x-forwarded-for", "198.51.100.1, 203.0.113.5")}
	buf := make([]Applied, 0, 8)
	buf = c.Apply(req, buf[:0])
	if len(buf) != 3 || buf[0].Key != "203.0.113.5" || buf[1].Tier != "pro" || buf[1].Cost != 5 || buf[2].Key != "/search/deep" {
		t.Fatalf("got %+v", buf)
	}
	allocs := testing.AllocsPerRun(200, func() { buf = c.Apply(req, buf[:0]) })
	if allocs != 0 {
		t.Errorf("Apply allocates %.1f times per call", allocs)
	}
}

func TestTier(t *testing.T) {
	tests := []struct {
		key, plan, want string
	}{
		{"sk_ent_1", "", "enterprise"},
		{"sk_ent_1", "pro", "enterprise"},
		{"sk_x", "pro", "pro"},
		{"", "pro", "pro"},
		{"sk_free_1", "", "free"},
		{"sk_x", "", ""},
		{"", "", ""},
	}
	for cname, c := range bothConfigs(t, precedenceDoc) {
		for _, tt := range tests {
			t.Run(cname+"/"+tt.key+"/"+tt.plan, func(t *testing.T) {
				req := &Request{Header: headers()}
				if tt.plan != "" {
					req.Header = headers("x-plan", tt.plan)
				}
				if got := c.Tier(req, tt.key); got != tt.want {
					t.Errorf("Tier = %q, want %q", got, tt.want)
				}
			})
		}
	}
}

func TestRuleByID(t *testing.T) {
	for cname, c := range bothConfigs(t, matchDoc) {
		t.Run(cname, func(t *testing.T) {
			for i := range c.Rules {
				if got := c.RuleByID(c.Rules[i].ID); got != &c.Rules[i] {
					t.Errorf("RuleByID(%q) = %p, want %p", c.Rules[i].ID, got, &c.Rules[i])
				}
			}
			if c.RuleByID("nope") != nil || c.RuleByID("") != nil {
				t.Error("found a rule that does not exist")
			}
		})
	}
	var nilConfig *Config
	if nilConfig.RuleByID("x") != nil {
		t.Error("nil config found a rule")
	}
}

func TestCheckLists(t *testing.T) {
	doc := `{
	  "allow": ["sk_internal_*", "10.0.0.0/8", "192.168.1.7", "2001:db8::/32", "sk_both", "sk_ex?ct", "100.64.0.0/10"],
	  "deny":  ["sk_revoked_*", "10.6.6.0/24", "2001:db8:bad::/48", "sk_both", "sk_first*", "sk_first_exact", "sk_second", "sk_sec*", "172.16.0.0/12", "sk_after_cidr"]
	}`
	tests := []struct {
		name    string
		key, ip string
		action  ListAction
		pattern string
	}{
		{"allow glob", "sk_internal_1", "", ListAllow, "sk_internal_*"},
		{"question mark glob", "sk_exact", "", ListAllow, "sk_ex?ct"},
		{"question mark needs one byte", "sk_exct", "", ListNone, ""},
		{"deny beats allow by key", "sk_both", "", ListDeny, "sk_both"},
		{"deny key beats allow ip", "sk_revoked_9", "10.0.0.1", ListDeny, "sk_revoked_*"},
		{"allow ipv4 cidr", "sk_other", "10.1.2.3", ListAllow, "10.0.0.0/8"},
		{"deny ipv4 cidr inside allowed cidr", "sk_other", "10.6.6.6", ListDeny, "10.6.6.0/24"},
		{"odd prefix length", "", "100.127.255.255", ListAllow, "100.64.0.0/10"},
		{"just outside odd prefix", "", "100.128.0.0", ListNone, ""},
		{"single ip with port", "", "192.168.1.7:443", ListAllow, "192.168.1.7"},
		{"neighbour of single ip", "", "192.168.1.8", ListNone, ""},
		{"allow ipv6 cidr", "", "2001:db8::1", ListAllow, "2001:db8::/32"},
		{"deny ipv6 cidr with brackets and port", "", "[2001:db8:bad::1]:8080", ListDeny, "2001:db8:bad::/48"},
		{"ipv4-mapped ipv6 matches ipv4 cidr", "", "::ffff:10.1.1.1", ListAllow, "10.0.0.0/8"},
		{"unparsable ip", "", "not-an-ip", ListNone, ""},
		{"nothing", "", "", ListNone, ""},
		{"first in config order: glob before exact", "sk_first_exact", "", ListDeny, "sk_first*"},
		{"first in config order: exact before glob", "sk_second", "", ListDeny, "sk_second"},
		{"first in config order: cidr before glob", "sk_after_cidr", "172.16.1.1", ListDeny, "172.16.0.0/12"},
		{"first in config order: glob before cidr", "sk_revoked_1", "10.6.6.1", ListDeny, "sk_revoked_*"},
	}
	for cname, c := range bothConfigs(t, doc) {
		for _, tt := range tests {
			t.Run(cname+"/"+tt.name, func(t *testing.T) {
				got := c.CheckLists(tt.key, tt.ip)
				if got.Action != tt.action || got.Pattern != tt.pattern {
					t.Errorf("CheckLists(%q, %q) = %v %q, want %v %q", tt.key, tt.ip, got.Action, got.Pattern, tt.action, tt.pattern)
				}
			})
		}
	}
	star := mustParse(t, `{"deny":["*"]}`)
	if got := star.CheckLists("", "1.2.3.4"); got.Action != ListNone {
		t.Errorf("empty key matched \"*\": %+v", got)
	}
	if got := star.CheckLists("anything/with/slashes", ""); got.Action != ListDeny {
		t.Errorf("\"*\" did not match a key with slashes: %+v", got)
	}
	if got := (&Config{}).CheckLists("k", "1.2.3.4"); got != (ListVerdict{}) {
		t.Errorf("empty lists: %+v", got)
	}
	if ListNone.String() != "none" || ListAllow.String() != "allow" || ListDeny.String() != "deny" {
		t.Error("ListAction.String")
	}
}

func TestCheckListsAllocations(t *testing.T) {
	c := mustParse(t, `{"allow":["sk_internal_*","10.0.0.0/8","sk_a","sk_b"],"deny":["sk_revoked_*","2001:db8::/32","sk_c"]}`)
	allocs := testing.AllocsPerRun(200, func() {
		c.CheckLists("sk_live_1", "10.1.2.3")
		c.CheckLists("sk_b", "[2001:db8::1]:443")
	})
	if allocs != 0 {
		t.Errorf("CheckLists allocates %.1f times per call", allocs)
	}
}

func TestGlobMatch(t *testing.T) {
	tests := []struct {
		pattern, s string
		fold, want bool
	}{
		{"", "", false, true},
		{"", "a", false, false},
		{"*", "", false, true},
		{"*", "a/b/c", false, true},
		{"a*", "a", false, true},
		{"a*b", "axxb", false, true},
		{"a*b", "axxbc", false, false},
		{"a*b*c", "abbbc", false, true},
		{"*.example.org", "a.b.example.org", false, true},
		{"*.example.org", "example.org", false, false},
		{"?", "", false, false},
		{"a?c", "abc", false, true},
		{"a?c", "ac", false, false},
		{"**a", "a", false, true},
		{"*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", false, false},
		{"[abc]", "[abc]", false, true},
		{"a\\*", "a\\xyz", false, true},
		{"API.example.com", "api.EXAMPLE.com", true, true},
		{"API.example.com", "api.example.com", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.pattern+"|"+tt.s, func(t *testing.T) {
			if got := globMatch(tt.pattern, tt.s, tt.fold); got != tt.want {
				t.Errorf("globMatch(%q, %q, %v) = %v", tt.pattern, tt.s, tt.fold, got)
			}
		})
	}
}

func BenchmarkApply(b *testing.B) {
	c := mustParse(b, precedenceDoc)
	req := &Request{Method: "GET", Path: "/search", Header: headers("x-api-key", "sk_ent_1")}
	buf := make([]Applied, 0, 8)
	b.ReportAllocs()
	for b.Loop() {
		buf = c.Apply(req, buf[:0])
	}
}

func TestCallerKeyAndListVerdicts(t *testing.T) {
	c, err := Parse([]byte(`{"key":{"source":"header","name":"x-api-key"},"deny":["sk_revoked_*","10.0.0.0/8"],"rules":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	req := &Request{Header: func(n string) (string, bool) {
		if n == "x-api-key" {
			return "sk_revoked_1", true
		}
		return "", false
	}, PeerAddr: "10.1.2.3:5000"}
	if got := c.CallerKey(req); got != "sk_revoked_1" {
		t.Fatalf("CallerKey = %q", got)
	}
	if v := c.CheckLists(c.CallerKey(req), c.ClientIP(req)); v.Action != ListDeny || v.Pattern != "sk_revoked_*" || v.ByAddress {
		t.Fatalf("key deny verdict %+v", v)
	}
	if v := c.CheckLists("sk_ok", c.ClientIP(req)); v.Action != ListDeny || !v.ByAddress {
		t.Fatalf("address deny verdict %+v", v)
	}
}

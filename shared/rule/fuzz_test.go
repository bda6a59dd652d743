package rule

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// checkInvariants asserts what every Config returned by Parse guarantees, independently
// of how the parser got there.
func checkInvariants(t testing.TB, c *Config) {
	t.Helper()
	if len(c.Rules) > MaxRules || len(c.Tiers) > MaxTiers || len(c.Allow) > MaxListEntries || len(c.Deny) > MaxListEntries {
		t.Fatalf("caps exceeded: %d rules %d tiers %d allow %d deny", len(c.Rules), len(c.Tiers), len(c.Allow), len(c.Deny))
	}
	s := c.Sync
	if s.IntervalMs < 10 || s.TimeoutMs < 1 || s.LeaseTTLMs < s.IntervalMs || s.MaxBatch < 1 || s.MaxBatch > wire.MaxDeltas ||
		s.MaxPending < 1 || s.ExpectedNodes < 1 || s.BreakerFailures < 1 || s.BreakerOpenMs < 1 || s.IdleTTLMs < 1000 ||
		len(s.Node) > wire.MaxStringLen || s.Authority == "" && s.Cluster != "" {
		t.Fatalf("bad sync %+v", s)
	}
	if c.RetryJitterMs < 0 || c.TrustedHops < 0 || c.TrustedHops > maxTrustedHops {
		t.Fatalf("jitter %d hops %d", c.RetryJitterMs, c.TrustedHops)
	}
	checkKeySource(t, &c.DefaultKey, 1)
	checkLevers(t, c)
	for _, list := range [][]Pattern{c.Allow, c.Deny} {
		for _, p := range list {
			if (p.Glob == "") == (p.CIDR == nil) || p.Raw == "" || p.CIDR != nil && (p.CIDR.Bits < 0 || p.CIDR.Bits > 128) {
				t.Fatalf("bad pattern %+v", p)
			}
		}
	}
	tierNames := map[string]bool{}
	for _, tier := range c.Tiers {
		if !validID(tier.Name) || tierNames[tier.Name] || len(tier.Keys) == 0 && (tier.Header == "" || len(tier.Values) == 0) {
			t.Fatalf("bad tier %+v", tier)
		}
		tierNames[tier.Name] = true
	}
	ids := map[string]bool{}
	for i := range c.Rules {
		r := &c.Rules[i]
		if !validID(r.ID) || ids[r.ID] || c.RuleByID(r.ID) != r {
			t.Fatalf("bad or duplicate id %q", r.ID)
		}
		ids[r.ID] = true
		if AlgorithmName(r.Algo) == "" || r.Cost < 1 || r.Cost > algo.MaxCost || len(r.Costs) > MaxCosts || len(r.Overrides) > MaxOverrides {
			t.Fatalf("rule %q: algo %d cost %d", r.ID, r.Algo, r.Cost)
		}
		if r.MaxInFlight < 0 || r.MaxInFlight > MaxInFlight || r.MaxInFlight > 0 && r.Descriptors != nil {
			t.Fatalf("rule %q: max_in_flight %d", r.ID, r.MaxInFlight)
		}
		if len(r.Windows) > 0 || r.MaxInFlight == 0 || len(r.Tiers)+len(r.Overrides) > 0 {
			checkWindows(t, r.ID, r.Algo, r.Windows)
		}
		for name, w := range r.Tiers {
			if !tierNames[name] {
				t.Fatalf("rule %q: undefined tier %q", r.ID, name)
			}
			checkWindows(t, r.ID, r.Algo, w)
		}
		for _, o := range r.Overrides {
			if o.Glob == "" {
				t.Fatalf("rule %q: empty override glob", r.ID)
			}
			checkWindows(t, r.ID, r.Algo, o.Windows)
		}
		for _, rc := range r.Costs {
			if (rc.Prefix == "") == (rc.Regex == nil) || rc.Cost < 1 || rc.Cost > algo.MaxCost || rc.Prefix != "" && NormalizePath(rc.Prefix) != rc.Prefix {
				t.Fatalf("rule %q: bad cost %+v", r.ID, rc)
			}
		}
		if r.Match.Prefix != "" && NormalizePath(r.Match.Prefix) != r.Match.Prefix {
			t.Fatalf("rule %q: prefix %q not normalised", r.ID, r.Match.Prefix)
		}
		for _, m := range r.Match.Methods {
			if m == "" || m != strings.ToUpper(m) {
				t.Fatalf("rule %q: method %q", r.ID, m)
			}
		}
		for _, h := range r.Match.Hosts {
			if h == "" || h != strings.ToLower(h) {
				t.Fatalf("rule %q: host %q", r.ID, h)
			}
		}
		if !r.Key.IsZero() {
			checkKeySource(t, &r.Key, 1)
		}
		checkMatch(t, r.ID, &r.Match, true)
		switch mk := r.MissingKey; mk.Action {
		case MissingSkip:
		case MissingDeny:
			if mk.Status != 401 && mk.Status != 403 {
				t.Fatalf("rule %q: deny status %d", r.ID, mk.Status)
			}
		case MissingFallback:
			if mk.Key == nil {
				t.Fatalf("rule %q: fallback without a key", r.ID)
			}
			checkKeySource(t, mk.Key, 1)
		default:
			t.Fatalf("rule %q: missing-key action %d", r.ID, mk.Action)
		}
	}
	if c.RuleByID("no such rule!") != nil {
		t.Fatal("RuleByID found an invalid id")
	}
}

func checkMatch(t testing.TB, id string, m *Match, top bool) {
	t.Helper()
	if m.Path != "" && NormalizePath(m.Path) != m.Path {
		t.Fatalf("rule %q: path %q not normalised", id, m.Path)
	}
	for _, list := range [][]ValueMatch{m.Headers, m.Query} {
		if len(list) > maxConditions {
			t.Fatalf("rule %q: %d conditions", id, len(list))
		}
		for _, c := range list {
			if c.Name == "" || (c.Kind == ValueRegex) != (c.Regex != nil) || c.Kind == ValuePrefix && c.Value == "" {
				t.Fatalf("rule %q: bad condition %+v", id, c)
			}
		}
	}
	for _, c := range m.Headers {
		if c.Name != strings.ToLower(c.Name) {
			t.Fatalf("rule %q: header %q not lower-case", id, c.Name)
		}
	}
	if m.Not != nil {
		if !top || m.Not.isEmpty() || m.Not.Not != nil {
			t.Fatalf("rule %q: bad not block %+v", id, m.Not)
		}
		checkMatch(t, id, m.Not, false)
	}
}

func checkWindows(t testing.TB, id string, kind algo.Kind, ws []algo.Params) {
	t.Helper()
	if len(ws) == 0 || len(ws) > MaxWindows {
		t.Fatalf("rule %q: %d windows", id, len(ws))
	}
	for _, w := range ws {
		if w.Kind.CalendarPeriods() && w.Kind.ConfiguredAs() == kind {
			// a fixed_window's calendar window: the period travels in Burst
			if _, _, ok := w.Calendar(); !ok || w.Validate() != nil {
				t.Fatalf("rule %q: bad calendar window %+v (%v)", id, w, w.Validate())
			}
			continue
		}
		if w.Kind != kind || w.Validate() != nil || w.WindowUs%1000 != 0 ||
			w.Burst != 0 && !kind.HasBurst() {
			t.Fatalf("rule %q: bad window %+v (%v)", id, w, w.Validate())
		}
	}
}

func checkKeySource(t testing.TB, k *KeySource, depth int) {
	t.Helper()
	if depth > maxKeyDepth {
		t.Fatalf("key source nested %d deep", depth)
	}
	switch k.Kind {
	case KeyHeader:
		if k.Header == "" || k.Header != strings.ToLower(k.Header) {
			t.Fatalf("bad header source %+v", k)
		}
	case KeyJWTClaim:
		if k.Claim == "" || k.Header == "" {
			t.Fatalf("bad jwt source %+v", k)
		}
	case KeyIP:
		if k.TrustedHops < 0 || k.TrustedHops > maxTrustedHops {
			t.Fatalf("bad ip source %+v", k)
		}
	case KeyRoute:
	case KeyQuery:
		if k.Query == "" {
			t.Fatalf("bad query source %+v", k)
		}
	case KeyProperty:
		if len(k.Property) < 2 || len(k.Property) > maxPropertyTokens {
			t.Fatalf("bad property source %+v", k)
		}
	case KeyComposite:
		if len(k.Parts) < 2 || len(k.Parts) > maxParts {
			t.Fatalf("bad composite %+v", k)
		}
		for i := range k.Parts {
			checkKeySource(t, &k.Parts[i], depth+1)
		}
	default:
		t.Fatalf("bad kind %d", k.Kind)
	}
	if k.Fallback != nil {
		checkKeySource(t, k.Fallback, depth+1)
	}
}

func FuzzParse(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"rules":[{"id":"a","limit":1,"window":"1s","key":{"source":"route"}}]}`))
	f.Add([]byte(`{"rules":[{"id":"a","limit":1,"window":"1s","cost":3,"cost_from":{"body":"usage.total_tokens","max_body_bytes":2048}}]}`))
	f.Add([]byte(`{"rules":[{"id":"a","max_in_flight":3},{"id":"b","limit":1,"window":"1s","max_in_flight":1,"fail":"closed"}]}`))
	f.Add([]byte(`{"rules":[{"id":"a","algorithm":"fixed_window","windows":[{"limit":5,"calendar":{"period":"week","utc_offset":"-03:30"}},{"limit":1,"window":"1s"}]}]}`))
	f.Add([]byte(`{"telemetry":{"rule_stats":false,"decision_metadata":true},"rules":[{"id":"a","limit":1,"window":"1s"}]}`))
	f.Add([]byte(`{"rules":[{"id":"a","limit":1,"window":"1s","match":{"hosts":["api.example.com"],"path":"/search/x",
	  "headers":[{"name":"x-plan","exact":"pro"},{"name":"x-api-key","prefix":"sk_"},{"name":"x-id","regex":"^[0-9]+$","not":true}],
	  "query":[{"name":"q","exact":"1"},{"name":"debug","not":true}],"not":{"methods":["DELETE"]}},
	  "key":{"source":"composite","parts":[{"source":"metadata","namespace":"envoy.filters.http.jwt_authn","path":"my_payload.tenant"},
	    {"source":"header","name":"authorization","strip_prefix":"Bearer ","lowercase":true}]},
	  "missing_key":{"action":"deny","status":403}},
	 {"id":"b","limit":1,"window":"1s","key":{"source":"query","name":"q"},"missing_key":{"action":"fallback","key":{"source":"filter_state","name":"t"}}}]}`))
	f.Add([]byte(`{"rules":[{"id":"a","limit":1,"window":"1s","descriptors":{"domain":"d","entries":[{"key":"k","except":["v"]}]}},` +
		`{"id":"b","limit":1,"window":"1s","descriptors":{"domain":"d","entries":[{"key":"k","value":"v"}],"replaces":["a"]}}]}`))
	req := &Request{Method: "GET", Host: "api.example.com:443", Path: "/search/x?q=1", PeerAddr: "10.1.2.3:5555",
		Header: func(name string) (string, bool) {
			switch name {
			case "x-api-key":
				return "sk_ent_1", true
			case "x-plan":
				return "pro", true
			}
			return "", false
		},
		Property: func(path []string) (string, bool) {
			if len(path) > 0 && path[len(path)-1] == "tenant" {
				return "acme", true
			}
			return "", false
		}}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			es, ok := err.(*Errors)
			if !ok || len(es.List) == 0 || len(es.List) > MaxErrors {
				t.Fatalf("error %v is %T, not *Errors with 1..%d errors", err, err, MaxErrors)
			}
			// The syntax scanner agrees with encoding/json on what is JSON (too deep a
			// nesting aside) and points inside the document.
			first := es.List[0]
			if len(data) <= MaxConfigSize && !strings.Contains(first.Msg, "nested deeper") && first.Syntax == json.Valid(data) {
				t.Fatalf("encoding/json says valid=%v, Parse says %v", json.Valid(data), first)
			}
			if first.Syntax && (first.Offset < 0 || first.Offset > len(data)) {
				t.Fatalf("syntax error %v at offset %d of %d bytes", first, first.Offset, len(data))
			}
			return
		}
		checkInvariants(t, c)
		for _, a := range c.Apply(req, nil) {
			if a.Refuse != 0 {
				if a.Key != "" || a.Refuse != 401 && a.Refuse != 403 || a.Rule.MissingKey.Action != MissingDeny {
					t.Fatalf("bad refusal %+v", a)
				}
				continue
			}
			if a.Key == "" || len(a.Key) > MaxKeyLen || a.Cost < 1 || len(a.Windows) == 0 && a.Rule.MaxInFlight == 0 {
				t.Fatalf("bad applied %+v", a)
			}
		}
		c.CheckLists("sk_ent_1", "10.1.2.3")
	})
}

func FuzzNormalizePath(f *testing.F) {
	for _, s := range []string{"", "/", "//", "/a/b/../c/./d//", "/%2e%2E/x", "/%%32%65", "/a%2fb", "/a?b#c",
		"a/b", "/..", "/a/..", "/%7Euser/", "/%", "/%4", "/%zz", "/ä/ö"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		n := NormalizePath(p)
		if n == "" || n[0] != '/' {
			t.Fatalf("%q -> %q: not rooted", p, n)
		}
		if n != "/" && n[len(n)-1] == '/' {
			t.Fatalf("%q -> %q: trailing slash", p, n)
		}
		if strings.Contains(n, "//") || strings.ContainsAny(n, "?#") {
			t.Fatalf("%q -> %q: empty segment, query or fragment", p, n)
		}
		for _, seg := range strings.Split(n[1:], "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("%q -> %q: dot segment", p, n)
			}
		}
		if again := NormalizePath(n); again != n {
			t.Fatalf("not idempotent: %q -> %q -> %q", p, n, again)
		}
		if !isNormalPath(n) {
			t.Fatalf("%q -> %q: result fails isNormalPath", p, n)
		}
	})
}

func FuzzJWTClaim(f *testing.F) {
	f.Add("Bearer a.b.c", `{"sub":"alice"}`, "sub")
	f.Add("eyJ.eyJ.", `{"sub":42}`, "sub")
	f.Add("bearer x..y", `{"org":{"id":"acme"}}`, "org.id")
	f.Add("", `[1,2]`, "0")
	f.Add("Bearer ...", `{"sub":"a\"b\u00e9"}`, "sub")
	f.Fuzz(func(t *testing.T, raw, payload, claim string) {
		if got := jwtClaim(raw, claim); len(got) > len(raw) {
			t.Fatalf("claim %q longer than the token %q", got, raw)
		}
		if _, err := parseClaim("claim", gjson.Result{Type: gjson.String, Str: claim}); err != nil {
			return // only claims a config could hold
		}
		tok := "Bearer eyJhbGciOiJub25lIn0." + base64.RawURLEncoding.EncodeToString([]byte(payload)) + ".sig"
		want := ""
		if gjson.Valid(payload) && strings.HasPrefix(strings.TrimLeft(payload, " \t\r\n"), "{") {
			switch r := gjson.Get(payload, claim); r.Type {
			case gjson.String:
				want = r.Str
			case gjson.Number:
				want = r.Raw
			}
		}
		if len(tok) > maxTokenLen {
			want = ""
		}
		if got := jwtClaim(tok, claim); got != want {
			t.Fatalf("payload %q claim %q: got %q, want %q", payload, claim, got, want)
		}
	})
}

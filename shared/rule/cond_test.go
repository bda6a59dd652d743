package rule

import (
	"net/url"
	"strings"
	"testing"
)

// props builds a Request.Property from NUL-separated paths to values; it allocates
// nothing per lookup, like the filter's reader.
func props(kv ...string) func([]string) (string, bool) {
	return func(path []string) (string, bool) {
		for i := 0; i+1 < len(kv); i += 2 {
			if joinedEqual(kv[i], path) {
				return kv[i+1], true
			}
		}
		return "", false
	}
}

func joinedEqual(joined string, path []string) bool {
	for i, p := range path {
		if i > 0 {
			if joined == "" || joined[0] != 0 {
				return false
			}
			joined = joined[1:]
		}
		if !strings.HasPrefix(joined, p) {
			return false
		}
		joined = joined[len(p):]
	}
	return joined == ""
}

func TestMatchConditions(t *testing.T) {
	req := func(method, host, path string, hdr ...string) *Request {
		return &Request{Method: method, Host: host, Path: path, Header: headers(hdr...), PeerAddr: "10.0.0.1:1"}
	}
	tests := []struct {
		name  string
		match string
		req   *Request
		want  bool
	}{
		{"prefix", `{"prefix":"/api"}`, req("GET", "h", "/api/x"), true},
		{"prefix other", `{"prefix":"/api"}`, req("GET", "h", "/apix"), false},
		{"path exact", `{"path":"/login"}`, req("POST", "h", "/login"), true},
		{"path exact normalised", `{"path":"/login/"}`, req("POST", "h", "//login/?next=/"), true},
		{"path exact not a prefix", `{"path":"/login"}`, req("POST", "h", "/login/x"), false},
		{"regex", `{"regex":"^/v[0-9]+/"}`, req("GET", "h", "/v2/x"), true},
		{"regex no", `{"regex":"^/v[0-9]+/"}`, req("GET", "h", "/vx/x"), false},
		{"method", `{"methods":["post"]}`, req("POST", "h", "/"), true},
		{"method no", `{"methods":["POST"]}`, req("GET", "h", "/"), false},
		{"host glob", `{"hosts":["*.example.com"]}`, req("GET", "API.example.com:8443", "/"), true},
		{"host no", `{"hosts":["*.example.com"]}`, req("GET", "example.org", "/"), false},
		{"header present", `{"headers":[{"name":"X-Debug"}]}`, req("GET", "h", "/", "x-debug", ""), true},
		{"header present explicit", `{"headers":[{"name":"x-debug","present":true}]}`, req("GET", "h", "/", "x-debug", "1"), true},
		{"header absent", `{"headers":[{"name":"x-debug"}]}`, req("GET", "h", "/"), false},
		{"header not present", `{"headers":[{"name":"x-debug","not":true}]}`, req("GET", "h", "/"), true},
		{"header exact", `{"headers":[{"name":"x-env","exact":"prod"}]}`, req("GET", "h", "/", "x-env", " prod "), true},
		{"header exact case", `{"headers":[{"name":"x-env","exact":"prod"}]}`, req("GET", "h", "/", "x-env", "Prod"), false},
		{"header exact not", `{"headers":[{"name":"x-env","exact":"prod","not":true}]}`, req("GET", "h", "/", "x-env", "dev"), true},
		{"header exact not absent", `{"headers":[{"name":"x-env","exact":"prod","not":true}]}`, req("GET", "h", "/"), true},
		{"header prefix", `{"headers":[{"name":"authorization","prefix":"Bearer "}]}`, req("GET", "h", "/", "authorization", "Bearer x"), true},
		{"header prefix no", `{"headers":[{"name":"authorization","prefix":"Bearer "}]}`, req("GET", "h", "/", "authorization", "Basic x"), false},
		{"header regex", `{"headers":[{"name":"user-agent","regex":"(?i)bot"}]}`, req("GET", "h", "/", "user-agent", "GoogleBot/2"), true},
		{"header regex no", `{"headers":[{"name":"user-agent","regex":"(?i)bot"}]}`, req("GET", "h", "/", "user-agent", "curl/8"), false},
		{"query present", `{"query":[{"name":"debug"}]}`, req("GET", "h", "/x?a=1&debug"), true},
		{"query present empty value", `{"query":[{"name":"debug"}]}`, req("GET", "h", "/x?debug=&a=1"), true},
		{"query absent", `{"query":[{"name":"debug"}]}`, req("GET", "h", "/x?a=1&debugx=1"), false},
		{"query exact", `{"query":[{"name":"format","exact":"csv file"}]}`, req("GET", "h", "/x?format=csv+file"), true},
		{"query exact encoded name", `{"query":[{"name":"format","exact":"csv"}]}`, req("GET", "h", "/x?%66ormat=%63sv"), true},
		{"query exact first wins", `{"query":[{"name":"format","exact":"csv"}]}`, req("GET", "h", "/x?format=json&format=csv"), false},
		{"query not", `{"query":[{"name":"format","exact":"csv","not":true}]}`, req("GET", "h", "/x?format=json"), true},
		{"query from Request.Query", `{"query":[{"name":"a","exact":"1"}]}`, &Request{Method: "GET", Path: "/x", Query: "a=1", PeerAddr: "10.0.0.1"}, true},
		{"not block", `{"prefix":"/api","not":{"prefix":"/api/health"}}`, req("GET", "h", "/api/x"), true},
		{"not block excludes", `{"prefix":"/api","not":{"prefix":"/api/health"}}`, req("GET", "h", "/api/health"), false},
		{"not block all of", `{"not":{"methods":["GET"],"headers":[{"name":"x-internal"}]}}`, req("GET", "h", "/"), true},
		{"not block all of holds", `{"not":{"methods":["GET"],"headers":[{"name":"x-internal"}]}}`, req("GET", "h", "/", "x-internal", "1"), false},
		{"three conditions", `{"hosts":["api.example.com"],"prefix":"/v1","headers":[{"name":"x-tenant","exact":"acme"}]}`,
			req("GET", "api.example.com", "/v1/x", "x-tenant", "acme"), true},
		{"three conditions one fails", `{"hosts":["api.example.com"],"prefix":"/v1","headers":[{"name":"x-tenant","exact":"acme"}]}`,
			req("GET", "api.example.com", "/v1/x", "x-tenant", "other"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for name, c := range bothConfigs(t, `{"key":{"source":"ip"},"rules":[{"id":"r","limit":5,"window":"1s","match":`+tt.match+`}]}`) {
				got := len(c.Apply(tt.req, nil)) == 1
				if got != tt.want {
					t.Errorf("%s: matched = %v, want %v", name, got, tt.want)
				}
			}
		})
	}
}

func TestKeySources(t *testing.T) {
	const jwtNS = "envoy.filters.http.jwt_authn"
	req := &Request{Method: "GET", Path: "/x?api_key=K%2B1&tenant=Acme&empty=", PeerAddr: "10.0.0.1:1",
		Header: headers("authorization", "Bearer Tok.EN", "x-user", "Alice", "x-api-key", "k"),
		Property: props(
			"metadata\x00filter_metadata\x00"+jwtNS+"\x00my_payload\x00sub", "user-7",
			"metadata\x00filter_metadata\x00"+jwtNS+"\x00my_payload\x00tenant", "t1",
			"metadata\x00filter_metadata\x00"+jwtNS+"\x00my_payload\x00n.s", "dotted",
			"metadata\x00filter_metadata\x00"+jwtNS+"\x00my_payload\x00iat", "\x00\x00\x00\x00\x80\x84\xd9\x41", // a double
			"filter_state\x00tenant", "fs-tenant",
		)}
	tests := []struct {
		name, key, want string
	}{
		{"query", `{"source":"query","name":"api_key"}`, "K+1"},
		{"query lowercase", `{"source":"query","name":"tenant","lowercase":true}`, "acme"},
		{"query empty", `{"source":"query","name":"empty","fallback":{"source":"ip"}}`, "10.0.0.1"},
		{"query missing", `{"source":"query","name":"nope","fallback":{"source":"ip"}}`, "10.0.0.1"},
		{"metadata claim", `{"source":"metadata","namespace":"` + jwtNS + `","path":"my_payload.sub"}`, "user-7"},
		{"metadata array path", `{"source":"metadata","namespace":"` + jwtNS + `","path":["my_payload","n.s"]}`, "dotted"},
		{"metadata binary value", `{"source":"metadata","namespace":"` + jwtNS + `","path":"my_payload.iat","fallback":{"source":"ip"}}`, "10.0.0.1"},
		{"metadata missing", `{"source":"metadata","namespace":"` + jwtNS + `","path":"my_payload.org","fallback":{"source":"route"}}`, "/x"},
		{"filter state", `{"source":"filter_state","name":"tenant"}`, "fs-tenant"},
		{"strip bearer", `{"source":"header","name":"authorization","strip_prefix":"bearer "}`, "Tok.EN"},
		{"strip bearer lowercase", `{"source":"header","name":"authorization","strip_prefix":"Bearer ","lowercase":true}`, "tok.en"},
		{"strip absent prefix keeps value", `{"source":"header","name":"x-user","strip_prefix":"Bearer "}`, "Alice"},
		{"composite tenant:user", `{"source":"composite","parts":[{"source":"metadata","namespace":"` + jwtNS + `","path":"my_payload.tenant"},{"source":"metadata","namespace":"` + jwtNS + `","path":"my_payload.sub"}]}`, "t1:user-7"},
		{"composite header and query", `{"source":"composite","parts":[{"source":"query","name":"tenant","lowercase":true},{"source":"header","name":"x-user"}]}`, "acme:Alice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustParse(t, `{"rules":[{"id":"r","limit":5,"window":"1s","key":`+tt.key+`}]}`)
			got := c.Apply(req, nil)
			if len(got) != 1 || got[0].Key != tt.want {
				t.Fatalf("got %+v, want key %q", got, tt.want)
			}
		})
	}
	t.Run("no property reader", func(t *testing.T) {
		c := mustParse(t, `{"rules":[{"id":"r","limit":5,"window":"1s","key":{"source":"filter_state","name":"tenant"}}]}`)
		if got := c.Apply(&Request{Path: "/"}, nil); len(got) != 0 {
			t.Fatalf("got %+v", got)
		}
	})
}

func TestMissingKeyPolicy(t *testing.T) {
	const rule = `"id":"r","limit":5,"window":"1s","key":{"source":"header","name":"x-tenant"}`
	tests := []struct {
		name, policy string
		wantLen      int
		wantKey      string
		wantRefuse   int
	}{
		{"default skips", ``, 0, "", 0},
		{"skip", `,"missing_key":"skip"`, 0, "", 0},
		{"skip object", `,"missing_key":{"action":"skip"}`, 0, "", 0},
		{"deny", `,"missing_key":"deny"`, 1, "", 401},
		{"deny 403", `,"missing_key":{"action":"deny","status":403}`, 1, "", 403},
		{"fallback", `,"missing_key":{"action":"fallback","key":{"source":"ip"}}`, 1, "10.0.0.1", 0},
		{"fallback missing too", `,"missing_key":{"action":"fallback","key":{"source":"query","name":"t"}}`, 0, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustParse(t, `{"rules":[{`+rule+tt.policy+`}]}`)
			got := c.Apply(&Request{Path: "/", PeerAddr: "10.0.0.1:1", Header: headers()}, nil)
			if len(got) != tt.wantLen {
				t.Fatalf("got %+v", got)
			}
			if tt.wantLen == 1 && (got[0].Key != tt.wantKey || got[0].Refuse != tt.wantRefuse) {
				t.Fatalf("got key %q refuse %d, want %q %d", got[0].Key, got[0].Refuse, tt.wantKey, tt.wantRefuse)
			}
			// With the key present every policy limits under it.
			got = c.Apply(&Request{Path: "/", PeerAddr: "10.0.0.1:1", Header: headers("x-tenant", "acme")}, nil)
			if len(got) != 1 || got[0].Key != "acme" || got[0].Refuse != 0 {
				t.Fatalf("with key: got %+v", got)
			}
		})
	}
}

// TestMatchAllocations: header, query and not conditions and the query and metadata
// key sources allocate nothing (a property value is the host's memory).
func TestMatchAllocations(t *testing.T) {
	c := mustParse(t, `{"rules":[
	  {"id":"a","limit":9,"window":"1s","key":{"source":"query","name":"k"},
	   "match":{"hosts":["api.example.com"],"prefix":"/v1","path":"/v1/x","headers":[{"name":"x-env","exact":"prod"},{"name":"x-b","prefix":"b"},{"name":"ua","regex":"^c"}],
	            "query":[{"name":"k"},{"name":"f","exact":"csv file"}],"not":{"headers":[{"name":"x-internal"}]}}},
	  {"id":"b","limit":9,"window":"1s","key":{"source":"metadata","namespace":"ns","path":"p.sub","strip_prefix":"u-"}},
	  {"id":"c","limit":9,"window":"1s","key":{"source":"header","name":"authorization","strip_prefix":"Bearer ","lowercase":true}},
	  {"id":"d","limit":9,"window":"1s","key":{"source":"composite","parts":[{"source":"metadata","namespace":"ns","path":"p.sub"},{"source":"query","name":"k","lowercase":true}]}}]}`)
	keyBuf := make([]byte, 0, 64)
	req := &Request{Method: "GET", Host: "api.example.com", Path: "/v1/x?k=Key1&f=csv+file",
		Header:   headers("x-env", "prod", "x-b", "bb", "ua", "cc", "authorization", "Bearer TOK"),
		Property: props("metadata\x00filter_metadata\x00ns\x00p\x00sub", "u-7"),
		KeyBuf:   &keyBuf}
	buf := c.Apply(req, make([]Applied, 0, 4))
	if len(buf) != 4 || buf[0].Key != "Key1" || buf[1].Key != "7" || buf[2].Key != "tok" || buf[3].Key != "u-7:key1" {
		t.Fatalf("got %+v", buf)
	}
	if allocs := testing.AllocsPerRun(200, func() { keyBuf = keyBuf[:0]; buf = c.Apply(req, buf[:0]) }); allocs != 0 {
		t.Errorf("Apply allocates %.1f times per call", allocs)
	}
}

func FuzzQueryEqual(f *testing.F) {
	for _, s := range []string{"a", "a+b", "%61", "%6", "%zz", "a%2Bb", "", "%%41"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		want, err := url.QueryUnescape(raw)
		if err != nil {
			return // url refuses bad escapes; queryEqual keeps them literal
		}
		if !queryEqual(raw, want) {
			t.Fatalf("queryEqual(%q, %q) = false", raw, want)
		}
		if got := queryUnescape(raw); got != want {
			t.Fatalf("queryUnescape(%q) = %q, want %q", raw, got, want)
		}
		if queryEqual(raw, want+"x") {
			t.Fatalf("queryEqual(%q, %q) = true", raw, want+"x")
		}
	})
}

// BenchmarkApplyMatch is rule.Apply natively for a prefix-only rule and for one that
// also matches the host and a header's exact value (the compiled module's comparison is
// bench/perf's BenchmarkMatchConditions).
func BenchmarkApplyMatch(b *testing.B) {
	req := &Request{Method: "GET", Host: "api.example.com", Path: "/v1/search?q=tollgate",
		Header: headers("user-agent", "tollgate-bench/1", "accept", "application/json", "x-api-key", "k-bench", "x-forwarded-proto", "http")}
	for _, tc := range []struct{ name, match string }{
		{"prefix", `{"prefix":"/v1/search"}`},
		{"host+prefix+header", `{"hosts":["api.example.com"],"prefix":"/v1/search","headers":[{"name":"x-forwarded-proto","exact":"http"}]}`},
		{"host+prefix", `{"hosts":["api.example.com"],"prefix":"/v1/search"}`},
		{"prefix+header", `{"prefix":"/v1/search","headers":[{"name":"x-forwarded-proto","exact":"http"}]}`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := mustParse(b, `{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"api","limit":9,"window":"1s","match":`+tc.match+`}]}`)
			buf := make([]Applied, 0, 4)
			b.ReportAllocs()
			for b.Loop() {
				if buf = c.Apply(req, buf[:0]); len(buf) != 1 {
					b.Fatal("rule not applied")
				}
			}
		})
	}
}

// TestValidMatchAndKeysFixture: the valid fixture of the new syntax (also a FuzzParse
// seed) parses to what it says.
func TestValidMatchAndKeysFixture(t *testing.T) {
	c, err := Parse(readFixture(t, "valid_match_and_keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, c)
	tu := c.RuleByID("tenant-user")
	if c.DefaultKey.Kind != KeyProperty || c.DefaultKey.Fallback.StripPrefix != "Bearer " || !c.DefaultKey.Fallback.Lower ||
		c.RuleByID("tenant").MissingKey.Action != MissingDeny || c.RuleByID("tenant").MissingKey.Status != 401 ||
		len(tu.Match.Headers) != 3 || tu.Match.Headers[2].Kind != ValueRegex || len(tu.Match.Query) != 2 || !tu.Match.Query[1].Not ||
		tu.Match.Not == nil || tu.Match.Not.Path != "/v1/health" || tu.MissingKey.Key.Query != "api_key" ||
		strings.Join(tu.Key.Parts[1].Property, "/") != "metadata/filter_metadata/envoy.filters.http.jwt_authn/my_payload/sub" {
		t.Fatalf("parsed to %+v", c)
	}
}

// FuzzQueryParam: the first parameter queryParam finds, decoded, is the first value
// net/url gives for the name (for queries net/url accepts whole).
func FuzzQueryParam(f *testing.F) {
	for _, s := range [][2]string{{"a=1&b=2", "b"}, {"%61=x&a=y", "a"}, {"a&a=2", "a"}, {"q=a+b%20c", "q"}, {"=x&k", "k"}, {"k=%zz", "k"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, q, name string) {
		if name == "" {
			return
		}
		vals, err := url.ParseQuery(q)
		if err != nil {
			return
		}
		raw, ok := queryParam(q, name)
		want, wantOK := vals[name]
		if ok != wantOK {
			t.Fatalf("queryParam(%q, %q) found=%v, net/url %v", q, name, ok, wantOK)
		}
		if ok && queryUnescape(raw) != want[0] {
			t.Fatalf("queryParam(%q, %q) = %q (decoded %q), net/url %q", q, name, raw, queryUnescape(raw), want[0])
		}
	})
}

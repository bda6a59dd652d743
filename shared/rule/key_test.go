package rule

import (
	"encoding/base64"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func makeJWT(payload string) string {
	enc := base64.RawURLEncoding
	return enc.EncodeToString([]byte(`{"alg":"RS256","typ":"JWT"}`)) + "." + enc.EncodeToString([]byte(payload)) + ".c2lnbmF0dXJl"
}

func TestJWTClaim(t *testing.T) {
	good := makeJWT(`{"sub":"alice","org":{"id":"acme","n":7},"num":12345,"big":1e3,"flag":true,"arr":[1],"empty":"","esc":"a\"b","https://x.io/t":"tenant"}`)
	tests := []struct {
		name, header, claim, want string
	}{
		{"bearer", "Bearer " + good, "sub", "alice"},
		{"bearer any case and spaces", "  bEaReR   " + good + " ", "sub", "alice"},
		{"bare token", good, "sub", "alice"},
		{"nested claim", "Bearer " + good, "org.id", "acme"},
		{"number claim", "Bearer " + good, "num", "12345"},
		{"number claim raw text", "Bearer " + good, "big", "1e3"},
		{"escaped string", "Bearer " + good, "esc", `a"b`},
		{"escaped dot in path", "Bearer " + good, `https://x\.io/t`, "tenant"},
		{"missing claim", "Bearer " + good, "tenant", ""},
		{"empty claim", "Bearer " + good, "empty", ""},
		{"bool claim", "Bearer " + good, "flag", ""},
		{"object claim", "Bearer " + good, "org", ""},
		{"array claim", "Bearer " + good, "arr", ""},
		{"padded payload", "Bearer eyJhbGciOiJub25lIn0." + base64.URLEncoding.EncodeToString([]byte(`{"sub":"bob"}`)) + ".sig", "sub", "bob"},
		{"empty signature accepted (not verified here)", "Bearer eyJhbGciOiJub25lIn0." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"eve"}`)) + ".", "sub", "eve"},
		{"empty header", "", "sub", ""},
		{"scheme only", "Bearer ", "sub", ""},
		{"two segments", "Bearer a." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"x"}`)), "sub", ""},
		{"five segments (JWE)", "Bearer " + good + ".x.y", "sub", ""},
		{"empty first segment", "Bearer ." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"x"}`)) + ".s", "sub", ""},
		{"empty payload", "Bearer a..s", "sub", ""},
		{"standard base64 alphabet", "Bearer a." + strings.ReplaceAll(base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"x>>?"}`)), "_", "/") + ".s", "sub", ""},
		{"bad base64 length", "Bearer a.eyJzdWIiOiJ4In0x.s", "sub", ""},
		{"payload not json", "Bearer a." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"x"`)) + ".s", "sub", ""},
		{"payload is an array", "Bearer a." + base64.RawURLEncoding.EncodeToString([]byte(`["sub"]`)) + ".s", "0", ""},
		{"payload is a string", "Bearer a." + base64.RawURLEncoding.EncodeToString([]byte(`"sub"`)) + ".s", "sub", ""},
		{"other scheme", "Basic " + good, "sub", ""},
		{"too long", "Bearer " + makeJWT(`{"sub":"x","pad":"`+strings.Repeat("a", maxTokenLen)+`"}`), "sub", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := jwtClaim(tt.header, tt.claim); got != tt.want {
				t.Errorf("jwtClaim = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestDecodeBase64URL(t *testing.T) {
	for _, s := range []string{"", "a", "ab", "abc", "abcd", "\x00\xff\xfe", strings.Repeat("xyz\x01", 50)} {
		enc := base64.RawURLEncoding.EncodeToString([]byte(s))
		got, ok := decodeBase64URL(enc)
		if s == "" {
			if ok {
				t.Errorf("empty input decoded")
			}
			continue
		}
		if !ok || got != s {
			t.Errorf("decode(%q) = %q %v, want %q", enc, got, ok, s)
		}
	}
	for _, bad := range []string{"a", "abcde", "ab+c", "ab/c", "ab=c", "ab c"} {
		if _, ok := decodeBase64URL(bad); ok {
			t.Errorf("decoded invalid %q", bad)
		}
	}
}

func TestClientIP(t *testing.T) {
	tests := []struct {
		name string
		xff  string
		peer string
		hops int
		want string
	}{
		{"peer with port", "", "203.0.113.7:5555", 0, "203.0.113.7"},
		{"peer without port", "", "203.0.113.7", 0, "203.0.113.7"},
		{"peer ipv6 with port", "", "[2001:db8::1]:443", 0, "2001:db8::1"},
		{"peer ipv6 bare", "", "2001:db8::1", 0, "2001:db8::1"},
		{"peer ipv6 non-canonical", "", "[2001:DB8:0::1]:443", 0, "2001:db8::1"},
		{"peer ipv4-mapped", "", "[::ffff:10.0.0.1]:80", 0, "10.0.0.1"},
		{"peer ipv6 zone dropped", "", "[fe80::1%eth0]:80", 0, "fe80::1"},
		{"hops 0 ignores xff", "198.51.100.1", "10.0.0.1:1", 0, "10.0.0.1"},
		{"hops 1 is the rightmost entry", "198.51.100.1, 203.0.113.5", "10.0.0.1:1", 1, "203.0.113.5"},
		{"hops 2", "192.0.2.9, 198.51.100.1, 203.0.113.5", "10.0.0.1:1", 2, "198.51.100.1"},
		{"hops equal to entries", "198.51.100.1,203.0.113.5", "10.0.0.1:1", 2, "198.51.100.1"},
		{"fewer entries than hops", "203.0.113.5", "10.0.0.1:1", 2, "10.0.0.1"},
		{"no xff", "", "10.0.0.1:1", 1, "10.0.0.1"},
		{"xff entry with port", "198.51.100.1:1234", "10.0.0.1", 1, "198.51.100.1"},
		{"xff ipv6 entry", "[2001:db8::5]:1234, 2001:db8::6", "10.0.0.1", 2, "2001:db8::5"},
		{"invalid trusted entry", "198.51.100.1, unknown", "10.0.0.1", 1, ""},
		{"empty trusted entry", "198.51.100.1, ", "10.0.0.1", 1, ""},
		{"leading zeros refused", "", "010.0.0.1", 0, ""},
		{"unparsable peer", "", "localhost:80", 0, ""},
		{"empty peer", "", "", 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := &Request{PeerAddr: tt.peer, Header: headers()}
			if tt.xff != "" {
				req.Header = headers("x-forwarded-for", tt.xff)
			}
			if got := ClientIP(req, tt.hops); got != tt.want {
				t.Errorf("ClientIP = %q, want %q", got, tt.want)
			}
		})
	}
	c := mustParse(t, `{"key":{"source":"ip","trusted_hops":1}}`)
	req := &Request{PeerAddr: "10.0.0.1", Header: headers("x-forwarded-for", "1.1.1.1, 2.2.2.2")}
	if got := c.ClientIP(req); got != "2.2.2.2" {
		t.Errorf("Config.ClientIP = %q", got)
	}
	if ClientIP(nil, 1) != "" {
		t.Error("nil request has an IP")
	}
}

func TestExtract(t *testing.T) {
	req := &Request{
		Method: "GET", Path: "/users//42/?x=1", PeerAddr: "203.0.113.7:1",
		Header: headers("x-api-key", "  sk_live_1 ", "x-user", "u9", "authorization", "Bearer "+makeJWT(`{"sub":"alice","org":{"id":"acme"}}`),
			"x-empty", ""),
	}
	key := func(doc string) KeySource { return mustParse(t, `{"key":`+doc+`}`).DefaultKey }
	tests := []struct {
		name string
		src  KeySource
		want string
	}{
		{"header trimmed", key(`{"source":"header","name":"X-Api-Key"}`), "sk_live_1"},
		{"missing header", key(`{"source":"header","name":"x-missing"}`), ""},
		{"empty header is missing", key(`{"source":"header","name":"x-empty","fallback":{"source":"header","name":"x-user"}}`), "u9"},
		{"jwt", key(`{"source":"jwt","claim":"org.id"}`), "acme"},
		{"jwt missing falls back", key(`{"source":"jwt","claim":"tenant","fallback":{"source":"ip"}}`), "203.0.113.7"},
		{"ip", key(`{"source":"ip"}`), "203.0.113.7"},
		{"route", key(`{"source":"route"}`), "/users/42"},
		{"composite", key(`{"source":"composite","parts":[{"source":"jwt","claim":"sub"},{"source":"route"},{"source":"header","name":"x-user"}]}`), "alice:/users/42:u9"},
		{"composite missing part", key(`{"source":"composite","parts":[{"source":"header","name":"x-user"},{"source":"header","name":"x-missing"}]}`), ""},
		{"composite part fallback", key(`{"source":"composite","parts":[{"source":"header","name":"x-missing","fallback":{"source":"ip"}},{"source":"header","name":"x-user"}]}`), "203.0.113.7:u9"},
		{"composite missing falls back", key(`{"source":"composite","parts":[{"source":"header","name":"x-user"},{"source":"header","name":"x-missing"}],"fallback":{"source":"route"}}`), "/users/42"},
		{"fallback chain", key(`{"source":"header","name":"a","fallback":{"source":"header","name":"b","fallback":{"source":"header","name":"x-user"}}}`), "u9"},
		{"zero source yields nothing", KeySource{}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.src.Extract(req); got != tt.want {
				t.Errorf("Extract = %q, want %q", got, tt.want)
			}
		})
	}
	t.Run("cyclic hand-built source terminates", func(t *testing.T) {
		k := &KeySource{Kind: KeyHeader, Header: "x-missing"}
		k.Fallback = k
		if got := k.Extract(req); got != "" {
			t.Errorf("got %q", got)
		}
	})
}

func TestShortenKey(t *testing.T) {
	short := strings.Repeat("k", MaxKeyLen)
	if shortenKey(short) != short {
		t.Error("a key of MaxKeyLen bytes was changed")
	}
	a := shortenKey(strings.Repeat("k", MaxKeyLen) + "a")
	b := shortenKey(strings.Repeat("k", MaxKeyLen) + "b")
	if len(a) != MaxKeyLen || len(b) != MaxKeyLen || a == b {
		t.Errorf("long keys: %d %d equal=%v", len(a), len(b), a == b)
	}
	if a != shortenKey(strings.Repeat("k", MaxKeyLen)+"a") {
		t.Error("shortening is not deterministic")
	}
	if !strings.HasPrefix(a, strings.Repeat("k", MaxKeyLen-17)+"~") {
		t.Errorf("shortened key %q does not keep its prefix", a)
	}
	req := &Request{Header: headers("x-api-key", strings.Repeat("z", 5000))}
	if got := mustParse(t, `{}`).DefaultKey.Extract(req); len(got) != MaxKeyLen {
		t.Errorf("extracted key is %d bytes", len(got))
	}
}

func TestNormalizePath(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", "/"},
		{"/", "/"},
		{"/search", "/search"},
		{"/search/", "/search"},
		{"//search", "/search"},
		{"/a//b///c", "/a/b/c"},
		{"/a/./b/.", "/a/b"},
		{"/a/b/../c", "/a/c"},
		{"/a/b/../../..", "/"},
		{"/../../etc/passwd", "/etc/passwd"},
		{"/a/..b/c", "/a/..b/c"},
		{"/a/.b", "/a/.b"},
		{"search", "/search"},
		{"/search?q=1&x=/../", "/search"},
		{"/search#frag", "/search"},
		{"?q", "/"},
		{"/%73earch", "/search"},
		{"/%2e%2E/admin", "/admin"},
		{"/a/%2e/b", "/a/b"},
		{"/a%2fb", "/a%2Fb"},
		{"/a%2Fb/", "/a%2Fb"},
		{"/%7Euser", "/~user"},
		{"/100%", "/100%25"},
		{"/%zz", "/%25zz"},
		{"/%%32%65", "/%252e"},
		{"/caf%C3%A9", "/caf%C3%A9"},
		{"/ä", "/ä"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := NormalizePath(tt.in); got != tt.want {
				t.Errorf("NormalizePath(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
	allocs := testing.AllocsPerRun(100, func() { NormalizePath("/api/v1/search/items") })
	if allocs != 0 {
		t.Errorf("a canonical path allocates %.1f times", allocs)
	}
}

// TestBuildWasip1 keeps the package building for the filter's target.
func TestBuildWasip1(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go is not on PATH: %v", err)
	}
	cmd := exec.Command(goBin, "build", ".")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("GOOS=wasip1 GOARCH=wasm go build: %v\n%s", err, out)
	}
}

// The peer address is read only when a decision needs it (in the filter it costs a host
// call that copies data into the VM).
func TestPeerReadLazily(t *testing.T) {
	c, err := Parse([]byte(`{"key":{"source":"header","name":"x-api-key","fallback":{"source":"ip"}},"rules":[{"id":"a","limit":1,"window":"1s"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	mk := func(key string) *Request {
		return &Request{Path: "/", Header: func(n string) (string, bool) {
			if n == "x-api-key" && key != "" {
				return key, true
			}
			return "", false
		}, Peer: func() string { calls++; return "10.0.0.1:5" }}
	}
	if got := c.Apply(mk("k"), nil); len(got) != 1 || got[0].Key != "k" || calls != 0 {
		t.Fatalf("with the header present: %+v, peer read %d times", got, calls)
	}
	if got := c.Apply(mk(""), nil); len(got) != 1 || got[0].Key != "10.0.0.1" || calls != 1 {
		t.Fatalf("falling back to the IP: %+v, peer read %d times", got, calls)
	}
}

package wazerohost

import (
	"strings"
	"testing"
	"time"
)

func TestAccessLogFormat(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 6_000_000, time.UTC)
	e := &AccessEntry{
		Request: &Request{Method: "GET", Path: "/v1/search?q=1", Authority: "api.test", RemoteAddr: "10.0.0.1:5555",
			Header: []Pair{{"x-api-key", "sk_abuser"}}},
		Status: 429, Details: "tollgate_rate_limited",
		FilterState: map[string]string{"wasm.tollgate": "rule=api decision=limited"},
	}
	tests := []struct {
		name, format, want, wantErr string
	}{
		{"default", DefaultAccessLogFormat,
			`[2026-01-02T03:04:05.006Z] "GET /v1/search?q=1 HTTP/1.1" 429 tollgate_rate_limited "10.0.0.1:5555" tollgate="rule=api decision=limited"` + "\n", ""},
		{"missing values print a dash", "%FILTER_STATE(wasm.other)% %REQ(X-MISSING)% 100%%", "- - 100%", ""},
		{"header alternative", "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%", "/v1/search?q=1", ""},
		{"unknown operator", "%UPSTREAM_HOST%", "", "unsupported operator %UPSTREAM_HOST%"},
		{"typed filter state", "%FILTER_STATE(wasm.tollgate:TYPED)%", "", "only the PLAIN form"},
		{"unterminated", "%REQ(:PATH)", "", "unterminated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := ParseAccessLogFormat(tt.format)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := string(f.Append(nil, e, now)); got != tt.want {
				t.Fatalf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}

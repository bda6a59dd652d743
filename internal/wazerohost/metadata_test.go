package wazerohost

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"strings"
	"testing"
)

func TestMetadataProperty(t *testing.T) {
	req := &Request{
		Metadata: Metadata{JWTAuthnFilter: {"my_payload": map[string]any{
			"sub": "alice", "n": 42.0, "ok": true, "none": nil,
			"org":   map[string]any{"id": "acme"},
			"roles": []any{"admin", "dev"},
		}}},
		FilterState: map[string]string{"tenant": "t1"},
	}
	double := binary.LittleEndian.AppendUint64(nil, math.Float64bits(42))
	for _, tt := range []struct {
		path string
		want string
		st   Status
	}{
		{"metadata filter_metadata " + JWTAuthnFilter + " my_payload sub", "alice", StatusOK},
		{"metadata filter_metadata " + JWTAuthnFilter + " my_payload org id", "acme", StatusOK},
		{"metadata filter_metadata " + JWTAuthnFilter + " my_payload roles 1", "dev", StatusOK},
		{"metadata filter_metadata " + JWTAuthnFilter + " my_payload n", string(double), StatusOK},
		{"metadata filter_metadata " + JWTAuthnFilter + " my_payload ok", "\x01", StatusOK},
		{"metadata filter_metadata " + JWTAuthnFilter + " my_payload org", string(encodePairs(nil, []Pair{{"id", "acme"}})), StatusOK},
		{"metadata filter_metadata " + JWTAuthnFilter + " my_payload none", "", StatusSerializationFailure},
		{"metadata filter_metadata " + JWTAuthnFilter + " my_payload missing", "", StatusNotFound},
		{"metadata filter_metadata " + JWTAuthnFilter + " my_payload roles 2", "", StatusNotFound},
		{"metadata filter_metadata other.filter x", "", StatusNotFound},
		{"filter_state tenant", "t1", StatusOK},
		{"filter_state nope", "", StatusNotFound},
	} {
		t.Run(tt.path, func(t *testing.T) {
			got, st, ok := metadataProperty(req, strings.Split(tt.path, " "))
			if !ok || st != tt.st || string(got) != tt.want {
				t.Fatalf("got %q status %d (served %v), want %q status %d", got, st, ok, tt.want, tt.st)
			}
		})
	}
	if _, _, ok := metadataProperty(req, []string{"request", "path"}); ok {
		t.Error("request.path served as metadata")
	}
}

func TestJWTAuthnStandIn(t *testing.T) {
	j := &JWTAuthn{PayloadInMetadata: "my_payload"}
	tok := func(payload string) string {
		return "Bearer eyJhbGciOiJub25lIn0." + base64.RawURLEncoding.EncodeToString([]byte(payload)) + ".sig"
	}
	for _, tt := range []struct {
		name, auth, want string
	}{
		{"claims", tok(`{"sub":"alice","tenant":"acme"}`), "alice"},
		{"no token", "", ""},
		{"not a JWS", "Bearer abc", ""},
		{"payload not an object", tok(`[1]`), ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req := &Request{Header: []Pair{{"authorization", tt.auth}}}
			got, _, _ := metadataProperty(j.apply(req), []string{"metadata", "filter_metadata", JWTAuthnFilter, "my_payload", "sub"})
			if string(got) != tt.want {
				t.Fatalf("sub = %q, want %q", got, tt.want)
			}
			if req.Metadata != nil {
				t.Fatal("the caller's request was modified")
			}
		})
	}
}

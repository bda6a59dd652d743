package wazerohost

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Metadata is a request's dynamic metadata (Envoy's filter_metadata): a filter's name
// ("envoy.filters.http.jwt_authn") to its google.protobuf.Struct, written as the
// JSON-shaped Go values encoding/json produces (map[string]any, []any, string, float64,
// bool, nil).
type Metadata map[string]map[string]any

// JWTAuthnFilter is the metadata namespace Envoy's jwt_authn filter writes.
const JWTAuthnFilter = "envoy.filters.http.jwt_authn"

// JWTAuthn stands in for Envoy's jwt_authn filter with payload_in_metadata: the payload
// of a request's bearer token is put at
// metadata.filter_metadata["envoy.filters.http.jwt_authn"][PayloadInMetadata], claims as
// Struct values (numbers are doubles). The signature is NOT checked (a test stand-in);
// a request without a token, or with one that is not a JWS whose payload is a JSON
// object, gets no metadata, as jwt_authn with allow_missing_or_failed would leave it.
type JWTAuthn struct {
	PayloadInMetadata string // e.g. "my_payload"
	Header            string // default "authorization"; "Bearer " is stripped
}

// apply returns req with the token's payload in its metadata (a copy; req is the
// caller's), or req itself when there is nothing to add.
func (j *JWTAuthn) apply(req *Request) *Request {
	name := j.Header
	if name == "" {
		name = "authorization"
	}
	tok := strings.TrimSpace(req.Get(name))
	if len(tok) > 7 && strings.EqualFold(tok[:7], "bearer ") {
		tok = strings.TrimSpace(tok[7:])
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return req
	}
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return req
	}
	var payload map[string]any
	if json.Unmarshal(raw, &payload) != nil || payload == nil {
		return req
	}
	r := *req
	r.Metadata = Metadata{}
	for ns, s := range req.Metadata {
		r.Metadata[ns] = s
	}
	st := map[string]any{}
	for k, v := range r.Metadata[JWTAuthnFilter] {
		st[k] = v
	}
	st[j.PayloadInMetadata] = payload
	r.Metadata[JWTAuthnFilter] = st
	return &r
}

// metadataProperty serves metadata.filter_metadata.<filter>.<keys...> and
// filter_state.<name> the way Envoy's getProperty does: the path walks the Struct (a
// list by index), and the value found is serialised as Envoy serialises CEL values — a
// string as its raw bytes, a number as an 8-byte little-endian double, a bool as one
// byte, a struct as proxy-wasm pairs of key and serialised value, a list as pairs of
// serialised value and "". A null has no serialisation (SerializationFailure). ok is
// false when parts name neither.
func metadataProperty(r *Request, parts []string) ([]byte, Status, bool) {
	switch {
	case len(parts) >= 3 && parts[0] == "metadata" && parts[1] == "filter_metadata":
		st, found := r.Metadata[parts[2]]
		if !found {
			return nil, StatusNotFound, true
		}
		var v any = st
		for _, p := range parts[3:] {
			switch x := v.(type) {
			case map[string]any:
				if v, found = x[p]; !found {
					return nil, StatusNotFound, true
				}
			case []any:
				i, err := strconv.Atoi(p)
				if err != nil || i < 0 || i >= len(x) {
					return nil, StatusNotFound, true
				}
				v = x[i]
			default:
				return nil, StatusNotFound, true
			}
		}
		b, ok := serializeValue(v)
		if !ok {
			return nil, StatusSerializationFailure, true
		}
		return b, StatusOK, true
	case len(parts) == 2 && parts[0] == "filter_state":
		if v, found := r.FilterState[parts[1]]; found {
			return []byte(v), StatusOK, true
		}
		return nil, StatusNotFound, true
	}
	return nil, 0, false
}

func serializeValue(v any) ([]byte, bool) {
	switch x := v.(type) {
	case string:
		return []byte(x), true
	case float64:
		return binary.LittleEndian.AppendUint64(nil, math.Float64bits(x)), true
	case int:
		return binary.LittleEndian.AppendUint64(nil, math.Float64bits(float64(x))), true
	case json.Number:
		f, err := x.Float64()
		if err != nil {
			return nil, false
		}
		return binary.LittleEndian.AppendUint64(nil, math.Float64bits(f)), true
	case bool:
		if x {
			return []byte{1}, true
		}
		return []byte{0}, true
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		pairs := make([]Pair, 0, len(x))
		for _, k := range keys {
			b, ok := serializeValue(x[k])
			if !ok {
				return nil, false
			}
			pairs = append(pairs, Pair{k, string(b)})
		}
		return encodePairs(nil, pairs), true
	case []any:
		pairs := make([]Pair, 0, len(x))
		for _, e := range x {
			b, ok := serializeValue(e)
			if !ok {
				return nil, false
			}
			pairs = append(pairs, Pair{string(b), ""})
		}
		return encodePairs(nil, pairs), true
	}
	return nil, false
}

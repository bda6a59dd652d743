package refusal

import "strconv"

// gRPC status codes of Tollgate's refusals of gRPC requests (grpc/grpc doc
// statuscodes.md). A gRPC client sees these, not the HTTP status: RESOURCE_EXHAUSTED is
// what a rate limit is in gRPC's terms (and what Envoy's own rate limit filter answers
// gRPC callers with when asked to), where Envoy's default mapping of 429 would give
// UNAVAILABLE, which clients retry at once.
const (
	GRPCPermissionDenied  = 7  // deny list (HTTP 403)
	GRPCResourceExhausted = 8  // rate limited (HTTP 429)
	GRPCUnavailable       = 14 // fail-closed rule while degraded (HTTP 503)
	GRPCUnauthenticated   = 16 // missing key refused with 401 (missing_key "deny")
)

// GRPCStatusFor is the gRPC status of a refusal the filter answers with HTTP status
// httpStatus (gRPC's own mapping of HTTP statuses for 401 and 403).
func GRPCStatusFor(httpStatus int) int32 {
	switch httpStatus {
	case 401:
		return GRPCUnauthenticated
	case 403:
		return GRPCPermissionDenied
	case 503:
		return GRPCUnavailable
	}
	return GRPCResourceExhausted
}

// AppendGRPCMessage appends the grpc-message of a gRPC refusal: prefix, subject and,
// when retrySeconds >= 0, "; retry after N s". Bytes of subject outside printable
// ASCII become '?' (the proxy percent-encodes the message, but a readable one is
// kinder to logs).
func AppendGRPCMessage(dst []byte, prefix, subject string, retrySeconds int64) []byte {
	dst = append(dst, prefix...)
	for i := 0; i < len(subject); i++ {
		c := subject[i]
		if c < 0x20 || c > 0x7e {
			c = '?'
		}
		dst = append(dst, c)
	}
	if retrySeconds >= 0 {
		dst = append(dst, "; retry after "...)
		dst = strconv.AppendInt(dst, retrySeconds, 10)
		dst = append(dst, " s"...)
	}
	return dst
}

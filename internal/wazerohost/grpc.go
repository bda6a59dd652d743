package wazerohost

import "strings"

// maxGRPCStatus is the largest gRPC status code (UNAUTHENTICATED).
const maxGRPCStatus = 16

// IsGRPC reports whether a content-type is gRPC's, as Envoy's
// Grpc::Common::hasGrpcContentType decides: "application/grpc", or followed by "+" or
// ";" (application/grpc+proto). gRPC-Web is not: Envoy's grpc_web filter translates it.
func IsGRPC(contentType string) bool {
	const grpc = "application/grpc"
	if len(contentType) < len(grpc) || !strings.EqualFold(contentType[:len(grpc)], grpc) {
		return false
	}
	rest := contentType[len(grpc):]
	return rest == "" || rest[0] == '+' || rest[0] == ';'
}

// HTTPToGRPCStatus maps an HTTP status to a gRPC status as Envoy's
// Grpc::Utility::httpToGrpcStatus does for local replies without an explicit one
// (https://github.com/grpc/grpc/blob/master/doc/http-grpc-status-mapping.md).
func HTTPToGRPCStatus(status int) int {
	switch status {
	case 400:
		return 13 // INTERNAL
	case 401:
		return 16 // UNAUTHENTICATED
	case 403:
		return 7 // PERMISSION_DENIED
	case 404:
		return 12 // UNIMPLEMENTED
	case 429, 502, 503, 504:
		return 14 // UNAVAILABLE
	}
	return 2 // UNKNOWN
}

// PercentEncodeGRPC encodes a grpc-message value as the gRPC spec (PROTOCOL-HTTP2.md)
// and Envoy's Grpc::Utility::PercentEncoding do: bytes outside printable ASCII, and
// '%', become %XX.
func PercentEncodeGRPC(msg []byte) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for _, c := range msg {
		if c < ' ' || c > '~' || c == '%' {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

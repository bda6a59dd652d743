package wazerohost

import "testing"

func TestGRPCHelpers(t *testing.T) {
	for _, tt := range []struct {
		ct   string
		grpc bool
	}{
		{"application/grpc", true},
		{"application/grpc+proto", true},
		{"Application/GRPC;charset=utf-8", true},
		{"application/grpc-web", false},
		{"application/grpcx", false},
		{"application/json", false},
		{"", false},
	} {
		t.Run(tt.ct, func(t *testing.T) {
			if got := IsGRPC(tt.ct); got != tt.grpc {
				t.Fatalf("IsGRPC(%q) = %v, want %v", tt.ct, got, tt.grpc)
			}
		})
	}
	for status, want := range map[int]int{400: 13, 401: 16, 403: 7, 404: 12, 429: 14, 503: 14, 500: 2} {
		if got := HTTPToGRPCStatus(status); got != want {
			t.Errorf("HTTPToGRPCStatus(%d) = %d, want %d", status, got, want)
		}
	}
	if got := PercentEncodeGRPC([]byte("50% off\n\xff")); got != "50%25 off%0A%FF" {
		t.Errorf("PercentEncodeGRPC = %q", got)
	}
}

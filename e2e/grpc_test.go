package e2e

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tollgate-rl/tollgate/e2e/internal/harness"
)

// TestGRPCRefusal: a real gRPC client calls the gRPC health service through a gateway
// (the compiled filter in the e2e host, HTTP/2 cleartext both ways). Calls within the
// limit reach the service and carry the rate-limit headers; the call over it fails with
// RESOURCE_EXHAUSTED — not UNAVAILABLE, which clients retry at once — and its metadata
// carries the rate-limit headers and Retry-After. It runs on every host: on Envoy the
// client speaks HTTP/2 to Envoy's listener (codec AUTO, as shipped) and Envoy HTTP/2 to
// the service.
func TestGRPCRefusal(t *testing.T) {
	forHostsAtOnce(t, harness.Hosts(), testGRPCRefusal)
}

func testGRPCRefusal(t *testing.T, host string) {
	e := sharedEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)

	g, err := harness.StartGateway(harness.GatewayConfig{
		Host: host, Wasm: e.bins.Wasm, Workers: 2, NodeID: uniqueKey("grpc"), UpstreamHTTP2: true,
		Rules:    []byte(`{"key":{"source":"header","name":"x-api-key"},"rules":[{"id":"health","limit":2,"window":"1h","match":{"prefix":"/grpc.health.v1.Health"}}]}`),
		Services: e.serviceAddrs(), Secret: syncSecret, Pin: pinned,
		Upstream: "http://" + ln.Addr().String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	conn, err := grpc.NewClient(strings.TrimPrefix(g.URL, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := healthpb.NewHealthClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", uniqueKey("grpc-caller"))
	for i := 1; i <= 3; i++ {
		var hdr, trl metadata.MD
		resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr), grpc.Trailer(&trl))
		md := metadata.Join(hdr, trl)
		t.Logf("call %d: %v, status %v (%q); x-ratelimit-limit %v, x-ratelimit-remaining %v, retry-after %v, x-ratelimit-rule %v",
			i, resp.GetStatus(), status.Code(err), status.Convert(err).Message(),
			md.Get("x-ratelimit-limit"), md.Get("x-ratelimit-remaining"), md.Get("retry-after"), md.Get("x-ratelimit-rule"))
		want := []string{"x-ratelimit-limit", "x-ratelimit-remaining", "ratelimit-policy"}
		if i <= 2 {
			if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("call %d: %v %v, want SERVING", i, resp, err)
			}
		} else {
			st := status.Convert(err)
			if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "rate limited by rule health") {
				t.Fatalf("call %d: %v (%q), want ResourceExhausted naming the rule", i, st.Code(), st.Message())
			}
			want = append(want, "retry-after", "x-ratelimit-rule")
		}
		for _, name := range want {
			if len(md.Get(name)) == 0 {
				t.Errorf("call %d: no %s in the metadata %v", i, name, md)
			}
		}
	}
}

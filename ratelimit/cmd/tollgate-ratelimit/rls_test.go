package main

import (
	"bytes"
	"context"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/tollgate-rl/tollgate/internal/redistest"
)

// TestRLSListen: --rls-listen serves the gRPC rate limit service behind the sync secret
// (TOLLGATE_RLS_LISTEN works as every flag does), and the service still shuts down
// cleanly; without the flag nothing listens for it.
func TestRLSListen(t *testing.T) {
	srv := redistest.StartStandalone(t)
	for _, on := range []bool{true, false} {
		vars := map[string]string{"TOLLGATE_REDIS_ADDRS": srv.Addr(), "TOLLGATE_SYNC_SECRET": "s"}
		if on {
			vars["TOLLGATE_RLS_LISTEN"] = "127.0.0.1:0"
		}
		ctx, cancel := context.WithCancel(context.Background())
		ready := make(chan listening, 1)
		done := make(chan int, 1)
		var logs bytes.Buffer
		go func() {
			done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-format", "text"}, env(vars), &logs, &logs, ready)
		}()
		var l listening
		select {
		case l = <-ready:
		case code := <-done:
			t.Fatalf("exited %d before serving: %s", code, logs.String())
		}
		if !on {
			if l.rls != "" {
				t.Errorf("rate limit service on %s without --rls-listen", l.rls)
			}
			cancel()
			<-done
			continue
		}
		conn, err := grpc.NewClient(l.rls, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		c := rlsv3.NewRateLimitServiceClient(conn)
		req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
		if _, err := c.ShouldRateLimit(context.Background(), req); grpcstatus.Code(err) != codes.Unauthenticated {
			t.Errorf("without the secret: %v, want Unauthenticated", err)
		}
		resp, err := c.ShouldRateLimit(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer s"), req)
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Errorf("with the secret and no rules: %v %v, want OK", resp, err)
		}
		_ = conn.Close()
		cancel()
		if code := <-done; code != 0 {
			t.Fatalf("exit code %d after shutdown: %s", code, logs.String())
		}
	}
}

package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/tollgate-rl/tollgate/internal/redistest"
)

// TestRLQSListen: --rls-listen also serves the rate limit quota service behind the sync
// secret unless --rlqs=false; at shutdown an open stream gets a TTL-0 assignment for
// its buckets and ends, and the process exits without waiting out its shutdown timeout.
func TestRLQSListen(t *testing.T) {
	srv := redistest.StartStandalone(t)
	for _, on := range []bool{true, false} {
		vars := map[string]string{"TOLLGATE_REDIS_ADDRS": srv.Addr(), "TOLLGATE_SYNC_SECRET": "s", "TOLLGATE_RLS_LISTEN": "127.0.0.1:0"}
		if !on {
			vars["TOLLGATE_RLQS"] = "false"
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
		conn, err := grpc.NewClient(l.rls, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		open := func(token string) grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse] {
			sctx := context.Background()
			if token != "" {
				sctx = metadata.AppendToOutgoingContext(sctx, "authorization", "Bearer "+token)
			}
			s, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(sctx)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		report := &rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"api_key": "k"}}, NumRequestsAllowed: 1}}}
		s := open("s")
		_ = s.Send(report)
		resp, err := s.Recv()
		if !on {
			if grpcstatus.Code(err) != codes.Unimplemented {
				t.Errorf("--rlqs=false: %v, want Unimplemented", err)
			}
			_ = conn.Close()
			cancel()
			<-done
			continue
		}
		if err != nil || len(resp.GetBucketAction()) != 1 {
			t.Fatalf("with the secret: %v %v, want one bucket's assignment", resp, err)
		}
		bad := open("")
		_ = bad.Send(report)
		if _, err := bad.Recv(); grpcstatus.Code(err) != codes.Unauthenticated {
			t.Errorf("without the secret: %v, want Unauthenticated", err)
		}
		stopped := time.Now()
		cancel()
		resp, err = s.Recv()
		if err != nil || len(resp.GetBucketAction()) != 1 || resp.GetBucketAction()[0].GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration() != 0 {
			t.Errorf("at shutdown: %v %v, want a TTL-0 assignment", resp, err)
		}
		if code := <-done; code != 0 {
			t.Fatalf("exit code %d after shutdown: %s", code, logs.String())
		}
		if d := time.Since(stopped); d > 5*time.Second {
			t.Errorf("shutdown took %v: the open stream held the graceful stop", d)
		}
		_ = conn.Close()
	}
}

package service

import (
	"net/http"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// The gateways' liveness probe answers 200 while Redis answers, 503 within its budget
// once Redis stalls (SIGSTOP: connections stay open, nothing answers), and 200 again
// once it continues; /healthz, Kubernetes' liveness probe, answers 200 throughout.
func TestAliveFollowsRedis(t *testing.T) {
	srv, err := redistest.Launch(redistest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	in := start(t, opts{addrs: srv.Addrs()})
	status := func(path string) (int, time.Duration) {
		began := time.Now()
		code, _, _ := in.do(t, http.MethodGet, path, "", nil)
		return code, time.Since(began)
	}
	if code, _ := status(wire.AlivePath); code != http.StatusOK {
		t.Fatalf("alive with Redis up: %d, want 200", code)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = srv.Resume()
		}
	}()
	time.Sleep(2 * aliveTTL) // past the cached answer
	if code, took := status(wire.AlivePath); code != http.StatusServiceUnavailable {
		t.Errorf("alive with Redis paused: %d after %v, want 503", code, took)
	}
	if code, _ := status("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz with Redis paused: %d, want 200 (liveness must not depend on Redis)", code)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, _ := status(wire.AlivePath)
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alive still %d 5 s after Redis continued", code)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

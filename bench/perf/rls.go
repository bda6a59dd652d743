package perf

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
)

// RLSDomain and RLSDescriptorKey are the descriptor the gRPC benchmark sends: domain
// "bench", one entry api_key=<caller key>, selecting RLSRules' one rule.
const (
	RLSDomain        = "bench"
	RLSDescriptorKey = "api_key"
	// RLSLimit is the rule's limit per second (GCRA) and redis_rate's: never reached,
	// so both answer every check OK and the comparison is of the path, not of refusals.
	RLSLimit = 1_000_000
)

// RLSRules is the service's rule set in the gRPC benchmark.
var RLSRules = []byte(`{"rules":[{"id":"rls","algorithm":"gcra","limit":` + strconv.Itoa(RLSLimit) +
	`,"window":"1s","descriptors":{"domain":"` + RLSDomain + `","entries":[{"key":"` + RLSDescriptorKey + `"}]}}]}`)

// BuildService compiles the sync service (./ratelimit/cmd/tollgate-ratelimit, the recipe
// of `make build`) into dir and returns the executable's path.
func BuildService(dir string) (string, error) {
	root, err := wasmbuild.RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "tollgate-ratelimit")
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", bin, "./ratelimit/cmd/tollgate-ratelimit")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build tollgate-ratelimit: %w\n%s", err, out)
	}
	return bin, nil
}

// Process is a tollgate-ratelimit child process with its gRPC rate limit service on.
type Process struct {
	Pid     int
	URL     string // its HTTP listener (sync, admin and /metrics)
	RLSAddr string // its gRPC listener
	cmd     *exec.Cmd
	done    chan struct{}
	secrets string
}

// StartProcess runs bin against the standalone Redis at redisAddr with the benchmark's
// sync secret and admin token (as files), the admin API on the HTTP listener and the
// rate limit service on a loopback port, with args added (--rls-leases=false), and
// returns once it listens.
func StartProcess(bin, redisAddr string, args ...string) (*Process, error) {
	dir, err := os.MkdirTemp("", "tollgate-bench-secrets-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	for name, v := range map[string]string{"sync-secret": SyncSecret, "admin-token": AdminToken} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o600); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("secret file: %w", err)
		}
	}
	cmd := exec.Command(bin, "--listen", "127.0.0.1:0", "--admin-listen", "shared", "--rls-listen", "127.0.0.1:0",
		"--redis-addrs", redisAddr, "--sync-secret-file", filepath.Join(dir, "sync-secret"),
		"--admin-token-file", filepath.Join(dir, "admin-token"), "--log-format", "json")
	cmd.Args = append(cmd.Args, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TOLLGATE_") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	stderr, err := cmd.StderrPipe()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &Process{Pid: cmd.Process.Pid, cmd: cmd, done: make(chan struct{}), secrets: dir}
	type serving struct{ addr, rls string }
	ready := make(chan serving, 1)
	var early bytes.Buffer
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		found := false
		for sc.Scan() {
			if found {
				continue
			}
			var rec struct {
				Msg     string `json:"msg"`
				Addr    string `json:"addr"`
				RLSAddr string `json:"rls_addr"`
			}
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "serving" {
				found = true
				ready <- serving{rec.Addr, rec.RLSAddr}
				continue
			}
			if early.Len() < 8<<10 {
				early.Write(sc.Bytes())
				early.WriteByte('\n')
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
	}()
	select {
	case s := <-ready:
		p.URL, p.RLSAddr = "http://"+s.addr, s.rls
		return p, nil
	case <-p.done:
		os.RemoveAll(dir)
		return nil, fmt.Errorf("tollgate-ratelimit exited before serving: %s", early.String())
	case <-time.After(20 * time.Second):
		p.Stop()
		return nil, errors.New("tollgate-ratelimit did not serve within 20 s")
	}
}

// Stop ends the process (SIGTERM, then SIGKILL after 5 s).
func (p *Process) Stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	os.RemoveAll(p.secrets)
}

var httpc = &http.Client{Timeout: 10 * time.Second}

// PutRules stores doc as the rule set through the admin API.
func (p *Process) PutRules(doc []byte) error {
	req, err := http.NewRequest(http.MethodPut, p.URL+"/v1/rules", bytes.NewReader(doc))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+AdminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpc.Do(req)
	if err != nil {
		return fmt.Errorf("PUT /v1/rules: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("PUT /v1/rules: status %d: %s", resp.StatusCode, b)
	}
	return nil
}

// CPU is the process's user + system CPU time so far (/proc/<pid>/stat, in clock ticks
// of 10 ms: the kernel's USER_HZ is 100 on every Linux the benchmark runs on).
func (p *Process) CPU() (time.Duration, error) { return procCPU(p.Pid) }

func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	return statCPU(b)
}

// statCPU reads utime + stime from a /proc/<pid>/stat line.
func statCPU(b []byte) (time.Duration, error) {
	// The command name (field 2) may hold spaces; the fields after its ")" are fixed.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("/proc stat: no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, errors.New("/proc stat: too few fields")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("/proc stat: utime/stime not numbers")
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// selfCPU is this process's user + system CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// RoundTrips is the Redis round trips the process's store has made for batches and
// checks so far: tollgate_redis_seconds_count{op="sync"} on its /metrics.
func (p *Process) RoundTrips() (int64, error) {
	resp, err := httpc.Get(p.URL + "/metrics")
	if err != nil {
		return 0, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	const series = `tollgate_redis_seconds_count{op="sync"} `
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int64(f), err
		}
	}
	return 0, sc.Err()
}

// RLSResult is one run of the gRPC benchmark: the load (checks, latency, Redis work)
// and the CPU each process spent in the measured time.
type RLSResult struct {
	Load LoadResult
	Keys int
	// ServiceCPU is the service process's CPU (0 for the in-process limiter); ClientCPU
	// this process's (the load generator with, for redis_rate, the limiter itself).
	ServiceCPU, ClientCPU time.Duration
	// RoundTrips: the service's pipelines to Redis (its metrics), or one per script
	// call for redis_rate (INFO commandstats).
	RoundTrips int64
}

func (r RLSResult) per(d time.Duration) float64 {
	if r.Load.Checks == 0 {
		return 0
	}
	return float64(d.Microseconds()) / float64(r.Load.Checks)
}

// ServiceCPUPerCheck, ClientCPUPerCheck and RedisCPUPerCheck are µs per check (Redis:
// the redis-server process's CPU from /proc, all its threads).
func (r RLSResult) ServiceCPUPerCheck() float64 { return r.per(r.ServiceCPU) }
func (r RLSResult) ClientCPUPerCheck() float64  { return r.per(r.ClientCPU) }
func (r RLSResult) RedisCPUPerCheck() float64   { return r.Load.RedisWholeCPUPerCheck() }

// ChecksPerCore is checks per CPU second of every process involved (service, Redis and
// the load generator): what one core of the whole arrangement answers.
func (r RLSResult) ChecksPerCore() float64 {
	cpu := r.ServiceCPU.Seconds() + r.ClientCPU.Seconds() + r.Load.Redis.WholeCPU()
	if cpu <= 0 {
		return 0
	}
	return float64(r.Load.Checks) / cpu
}

// RoundTripsPerCheck is Redis round trips per check.
func (r RLSResult) RoundTripsPerCheck() float64 {
	if r.Load.Checks == 0 {
		return 0
	}
	return float64(r.RoundTrips) / float64(r.Load.Checks)
}

// rlsSnap is the counters read before and after the measured time.
type rlsSnap struct {
	info          RedisInfo
	svc, self     time.Duration
	trips         int64
	svcErr, trErr error
}

func snapRLS(rdb *redis.Client, p *Process) rlsSnap {
	var s rlsSnap
	if p != nil {
		s.svc, s.svcErr = p.CPU()
		s.trips, s.trErr = p.RoundTrips()
	}
	s.self = selfCPU()
	s.info, _ = ReadInfo(context.Background(), rdb)
	return s
}

func (r *RLSResult) fill(before, after rlsSnap) error {
	if err := errors.Join(before.svcErr, after.svcErr, before.trErr, after.trErr); err != nil {
		return err
	}
	r.ServiceCPU, r.ClientCPU = after.svc-before.svc, after.self-before.self
	r.Load.Redis = after.info.Since(before.info)
	r.RoundTrips = after.trips - before.trips
	return nil
}

// rlsRequests builds the requests for keys caller keys.
func rlsRequests(prefix string, keys int) []*rlsv3.RateLimitRequest {
	out := make([]*rlsv3.RateLimitRequest, keys)
	for i := range out {
		out[i] = &rlsv3.RateLimitRequest{Domain: RLSDomain, Descriptors: []*commonv3.RateLimitDescriptor{{
			Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: RLSDescriptorKey, Value: prefix + "-" + strconv.Itoa(i)}}}}}
	}
	return out
}

// RunRLS drives the process's ShouldRateLimit with a real gRPC client (one HTTP/2
// connection, as one Envoy worker holds) from o.Concurrency goroutines, closed loop,
// each request one descriptor with a caller key drawn uniformly from o.KeySpace, and
// measures it against rdb (the Redis the service uses).
func RunRLS(p *Process, rdb *redis.Client, o LoadOptions) (RLSResult, error) {
	o = o.withDefaults()
	conn, err := grpc.NewClient(p.RLSAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return RLSResult{}, err
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	reqs := rlsRequests(o.KeyPrefix, o.KeySpace)
	auth := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+SyncSecret)
	// Fail fast on a wrong set-up (no rule selected: every answer OK without Redis).
	resp, err := client.ShouldRateLimit(auth, reqs[0])
	if err != nil {
		return RLSResult{}, fmt.Errorf("ShouldRateLimit: %w", err)
	}
	if len(resp.Statuses) != 1 || resp.Statuses[0].CurrentLimit == nil {
		return RLSResult{}, fmt.Errorf("ShouldRateLimit selected no rule: %v", resp)
	}
	fn := func(_ context.Context, _, k int) (bool, error) {
		resp, err := client.ShouldRateLimit(auth, reqs[k])
		if err != nil {
			return false, err
		}
		return resp.OverallCode == rlsv3.RateLimitResponse_OK, nil
	}
	var before, after rlsSnap
	res := RLSResult{Keys: o.KeySpace}
	res.Load = runLoad(o, fn, func() { before = snapRLS(rdb, p) }, func() { after = snapRLS(rdb, p) })
	res.Load.Name = "gRPC ShouldRateLimit (tollgate-ratelimit)"
	if err := res.fill(before, after); err != nil {
		return res, err
	}
	return res, nil
}

// RunRLSRedisRate is the per-request baseline of RunRLS: go-redis/redis_rate's Allow
// (GCRA, one EVALSHA) on the same Redis, same goroutines, same keys, in this process.
func RunRLSRedisRate(rdb *redis.Client, o LoadOptions) (RLSResult, error) {
	o = o.withDefaults()
	c := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr, PoolSize: max(2*o.Concurrency, 20)})
	defer c.Close()
	lim := redis_rate.NewLimiter(c)
	rl := redis_rate.PerSecond(RLSLimit)
	keys := make([]string, o.KeySpace)
	for i := range keys {
		keys[i] = o.KeyPrefix + "-" + strconv.Itoa(i)
	}
	fn := func(ctx context.Context, _, k int) (bool, error) {
		r, err := lim.Allow(ctx, keys[k], rl)
		if err != nil {
			return false, err
		}
		return r.Allowed > 0, nil
	}
	var before, after rlsSnap
	res := RLSResult{Keys: o.KeySpace}
	res.Load = runLoad(o, fn, func() { before = snapRLS(rdb, nil) }, func() { after = snapRLS(rdb, nil) })
	res.Load.Name = "per-request redis_rate (GCRA)"
	if err := res.fill(before, after); err != nil {
		return res, err
	}
	res.RoundTrips = res.Load.Redis.Scripts()
	return res, nil
}

// RLSComparison is the gRPC benchmark at each key count: the service deciding from
// leases, the same service with --rls-leases=false (every check a script call in
// Redis), and the per-request baseline, run one after the other on the same Redis.
type RLSComparison struct {
	Keys                 int
	Leases, Strict, Rate RLSResult
}

// RLSKeys are the gRPC benchmark's key counts: 10 hot keys and 10,000 keys.
var RLSKeys = []int{10, 10_000}

// CompareRLS builds (or takes, bin not empty) the service and, at each of keyCounts,
// starts it on rdb's Redis with RLSRules, leases on, then off (a new process each, so
// neither's background work falls in the other's measurement), and runs RunRLS on each
// and RunRLSRedisRate, on keys of their own.
func CompareRLS(bin string, rdb *redis.Client, o LoadOptions, keyCounts []int) ([]RLSComparison, error) {
	if bin == "" {
		dir, err := os.MkdirTemp("", "tollgate-bench-bin-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		if bin, err = BuildService(dir); err != nil {
			return nil, err
		}
	}
	run := func(lo LoadOptions, args ...string) (RLSResult, error) {
		p, err := StartProcess(bin, rdb.Options().Addr, args...)
		if err != nil {
			return RLSResult{}, err
		}
		defer p.Stop()
		if err := p.PutRules(RLSRules); err != nil {
			return RLSResult{}, err
		}
		return RunRLS(p, rdb, lo)
	}
	var out []RLSComparison
	for _, n := range keyCounts {
		lo := o
		lo.KeySpace, lo.Keys = n, nil
		c := RLSComparison{Keys: n}
		var err error
		lo.KeyPrefix = "leases-" + strconv.Itoa(n)
		if c.Leases, err = run(lo); err != nil {
			return nil, fmt.Errorf("rls with leases, %d keys: %w", n, err)
		}
		lo.KeyPrefix = "strict-" + strconv.Itoa(n)
		if c.Strict, err = run(lo, "--rls-leases=false"); err != nil {
			return nil, fmt.Errorf("rls without leases, %d keys: %w", n, err)
		}
		lo.KeyPrefix = "rate-" + strconv.Itoa(n)
		if c.Rate, err = RunRLSRedisRate(rdb, lo); err != nil {
			return nil, fmt.Errorf("redis_rate, %d keys: %w", n, err)
		}
		out = append(out, c)
	}
	return out, nil
}

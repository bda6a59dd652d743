package perf

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
	"github.com/tollgate-rl/tollgate/internal/envoyproc"
)

// Envoy is a real Envoy (internal/envoyproc) running the repository's envoy.yaml with
// only its addresses, ports and paths substituted: the filter on envoy.wasm.runtime.v8,
// two workers unless told otherwise, its backend and sync service given by the caller.
type Envoy struct {
	*envoyproc.Proc
	Release string
	URL     string // the ingress listener ("http://127.0.0.1:PORT")
	Started time.Time
}

// EnvoyOptions say what to run.
type EnvoyOptions struct {
	Release     string // envoyproc.Newest, envoyproc.Oldest
	Wasm        []byte // the module
	Backend     string // host:port of the upstream
	Sync        string // host:port of the sync service
	Concurrency int    // 0: 2, as the shipped deployment is tested
	LogLevel    string // "": warning
	Args        []string
	// NoFilter removes the Wasm filter from the listener's chain: Envoy's own cost, the
	// baseline a module's is measured above.
	NoFilter bool
	// Edit, when set, rewrites the substituted bootstrap last: how a benchmark swaps the
	// Wasm filter for another limiter while keeping the rest of the shipped file.
	Edit func(cfg []byte) ([]byte, error)
}

// StartEnvoy writes the module and the substituted bootstrap to a directory of its own
// under dir and starts Envoy there.
func StartEnvoy(ctx context.Context, dir string, o EnvoyOptions) (*Envoy, error) {
	root, err := wasmbuild.RepoRoot()
	if err != nil {
		return nil, err
	}
	bin, err := envoyproc.Binary(root, o.Release)
	if err != nil {
		return nil, err
	}
	yaml, err := os.ReadFile(filepath.Join(root, "envoy.yaml"))
	if err != nil {
		return nil, err
	}
	wd, err := os.MkdirTemp(dir, "envoy-"+o.Release+"-")
	if err != nil {
		return nil, err
	}
	wasmPath := filepath.Join(wd, "filter.wasm")
	if err := os.WriteFile(wasmPath, o.Wasm, 0o644); err != nil {
		return nil, err
	}
	port, err := envoyproc.FreePort()
	if err != nil {
		return nil, err
	}
	backend, sync := portOf(o.Backend), portOf(o.Sync)
	cfg, err := envoyproc.ShippedConfig(yaml, envoyproc.Shipped{Listener: port, Backend: backend, Sync: sync, Wasm: wasmPath, SyncSecret: SyncSecret})
	if err != nil {
		return nil, err
	}
	if o.NoFilter {
		if cfg, err = withoutWasmFilter(cfg); err != nil {
			return nil, err
		}
	}
	if o.Edit != nil {
		if cfg, err = o.Edit(cfg); err != nil {
			return nil, err
		}
	}
	started := time.Now()
	p, err := envoyproc.Start(ctx, envoyproc.Options{Binary: bin, Config: cfg, Concurrency: o.Concurrency, Dir: wd, LogLevel: o.LogLevel, Args: o.Args})
	if err != nil {
		return nil, fmt.Errorf("envoy %s: %w", o.Release, err)
	}
	return &Envoy{Proc: p, Release: o.Release, URL: "http://127.0.0.1:" + strconv.Itoa(port), Started: started}, nil
}

// withoutWasmFilter cuts the envoy.filters.http.wasm entry out of the HTTP filter chain
// (everything from its "- name:" line to the next filter's).
func withoutWasmFilter(cfg []byte) ([]byte, error) {
	start := bytes.Index(cfg, []byte("- name: envoy.filters.http.wasm"))
	end := bytes.Index(cfg, []byte("- name: envoy.filters.http.router"))
	if start < 0 || end < start {
		return nil, fmt.Errorf("envoy.yaml: no wasm filter before the router")
	}
	return append(cfg[:start:start], cfg[end:]...), nil
}

func portOf(hostport string) int {
	_, p, _ := net.SplitHostPort(hostport)
	n, _ := strconv.Atoi(p)
	return n
}

// Stats reads Envoy's counters and gauges (/stats, "name: value" lines; histograms are
// left out).
func (e *Envoy) Stats(ctx context.Context) (map[string]uint64, error) {
	body, err := e.Get(ctx, "/stats")
	if err != nil {
		return nil, err
	}
	m := map[string]uint64{}
	for _, line := range strings.Split(body, "\n") {
		name, v, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			m[name] = n
		}
	}
	return m, nil
}

// ProcStat is what /proc says of a process: CPU time (user + system, all threads) and
// resident memory.
type ProcStat struct {
	CPU time.Duration
	RSS int64 // bytes
}

// ReadProc reads /proc/PID/stat and /proc/PID/status.
func ReadProc(pid int) (ProcStat, error) {
	var s ProcStat
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return s, err
	}
	// The command name (field 2) may hold spaces; the fields after its ')' are fixed.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return s, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64) // utime, field 14
	st, _ := strconv.ParseInt(f[12], 10, 64) // stime, field 15
	s.CPU = time.Duration(ut+st) * time.Second / clockTicks
	st2, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return s, err
	}
	sc := bufio.NewScanner(bytes.NewReader(st2))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			s.RSS = kb << 10
		}
	}
	return s, nil
}

// clockTicks is the kernel's USER_HZ, 100 on every Linux this runs on.
const clockTicks = 100

// Drive sends requests to url over conns keep-alive connections until n have been
// answered (or ctx ends): closed loop when rate is 0, else rate requests/s in all, each
// connection sending on its own schedule. req(i) builds the i-th request. It returns the
// count of answers by status; a transport error ends the run.
func Drive(ctx context.Context, url string, n, conns int, rate float64, req func(i int) *http.Request) (map[int]int, error) {
	tr := &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var next atomic.Int64
	var mu sync.Mutex
	status := map[int]int{}
	errs := make(chan error, conns)
	var wg sync.WaitGroup
	began := time.Now()
	for c := 0; c < conns; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := map[int]int{}
			defer func() {
				mu.Lock()
				for k, v := range local {
					status[k] += v
				}
				mu.Unlock()
			}()
			for sent := 0; ctx.Err() == nil; sent++ {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if rate > 0 { // request i is due at i/rate
					if d := time.Until(began.Add(time.Duration(float64(i) / rate * 1e9))); d > 0 {
						time.Sleep(d)
					}
				}
				r := req(i).WithContext(ctx)
				r.URL, _ = r.URL.Parse(url + r.URL.RequestURI())
				resp, err := client.Do(r)
				if err != nil {
					errs <- fmt.Errorf("request %d: %w", i, err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				local[resp.StatusCode]++
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return status, err
	}
	return status, ctx.Err()
}

// VMFailures are the lines of an Envoy log that say a Wasm VM failed or a callback
// trapped ("Function: proxy_on_request_headers failed", "wasm vm ... failed"), and the
// stats of failed VMs: what a soak must find none of.
var vmFailureLine = regexp.MustCompile(`(?i)Function: proxy_on_\w+ failed|wasm.*(trap|abort|panic|failed)|recovered panic`)

// VMFailureLines returns the log lines of the process that match vmFailureLine.
func (e *Envoy) VMFailureLines() []string {
	b, err := os.ReadFile(e.LogPath)
	if err != nil {
		return []string{"log: " + err.Error()}
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if vmFailureLine.MatchString(l) {
			out = append(out, l)
		}
	}
	return out
}

// MatchingStats returns the stats whose names contain every part, sorted by name.
func MatchingStats(stats map[string]uint64, parts ...string) []string {
	var out []string
	for k, v := range stats {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(k, p)
		}
		if ok {
			out = append(out, k+"="+strconv.FormatUint(v, 10))
		}
	}
	sort.Strings(out)
	return out
}

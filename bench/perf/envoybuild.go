package perf

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
	"github.com/tollgate-rl/tollgate/internal/envoyproc"
	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
)

// BuildVariant is one way of building the filter: the build tool
// (filter/wasmbuild/cmd/tollgate-wasm) with Flags, over the working tree's source. Rev,
// when set, takes the tool itself from that commit: how the variants of steps since
// removed from the build are still made (today's source, that commit's build steps).
type BuildVariant struct {
	Name  string
	Rev   string
	Flags []string
}

// PackRevision is the last commit whose build tool has wasmbuild's Pack (the data
// section DEFLATE-compressed, the runtime's file and line tables dropped): measured in
// Envoy, it did not pay (BENCHMARKS.md §12) and was removed.
const PackRevision = "78112bd"

// EnvoyBuildVariants are the builds BENCHMARKS.md §12 measures in Envoy.
var EnvoyBuildVariants = []BuildVariant{
	{Name: "shipped (make wasm)"},
	{Name: "without Thread", Flags: []string{"-no-thread"}},
	{Name: "with Pack, line tables dropped", Rev: PackRevision},
	{Name: "with Pack, line tables kept", Rev: PackRevision, Flags: []string{"-keep-lines"}},
	// The shipped build again, in an Envoy of its own: how far two Envoys running the same
	// module differ in these measurements on one machine (ControlVariant).
	{Name: "shipped, a second Envoy (A/A control)"},
}

// ControlVariant is the index of the A/A control in EnvoyBuildVariants: the shipped
// build measured twice.
const ControlVariant = 4

// Build builds the variant.
func (v BuildVariant) Build() ([]byte, error) {
	root, err := wasmbuild.RepoRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tollgate-variant-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	tool := filepath.Join(dir, "tollgate-wasm")
	src := root
	if v.Rev != "" {
		src = filepath.Join(dir, "src")
		if err := os.Mkdir(src, 0o755); err != nil {
			return nil, err
		}
		sh := exec.Command("sh", "-c", `git -C "$1" archive --format=tar "$2" | tar -x -C "$3"`, "sh", root, v.Rev, src)
		if out, err := sh.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("%s: git archive %s: %w: %s", v.Name, v.Rev, err, bytes.TrimSpace(out))
		}
	}
	build := exec.Command("go", "build", "-o", tool, "./filter/wasmbuild/cmd/tollgate-wasm")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%s: building tollgate-wasm: %w: %s", v.Name, err, out)
	}
	out := filepath.Join(dir, "filter.wasm")
	run := exec.Command(tool, append(append([]string{}, v.Flags...), "-o", out, FilterPkg)...)
	run.Dir = root // the working tree's filter, whichever tool builds it
	if msg, err := run.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%s: tollgate-wasm %v: %w: %s", v.Name, v.Flags, err, msg)
	}
	return os.ReadFile(out)
}

// GzipSize is the size of wasm compressed with gzip -9: what a user pulls (an OCI
// layer or a download is compressed so).
func GzipSize(wasm []byte) int {
	var b bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
	_, _ = zw.Write(wasm)
	_ = zw.Close()
	return b.Len()
}

// EnvoyBuildOptions say how MeasureEnvoyBuild runs.
type EnvoyBuildOptions struct {
	Release string        // the Envoy release (envoyproc.Newest)
	Starts  int           // starts of each variant, in turns (4)
	Rate    float64       // requests/s, the same for every variant (400)
	Warmup  time.Duration // at Rate before measuring, so V8's optimizing tier has run (3 s)
	Chunk   time.Duration // one measured chunk at Rate (2 s)
	Cycles  int           // chunks per variant, the variants in turns (30)
	Conns   int           // keep-alive connections (4)
}

func (o EnvoyBuildOptions) withDefaults() EnvoyBuildOptions {
	if o.Starts == 0 {
		o.Starts = 4
	}
	if o.Rate == 0 {
		o.Rate = 400
	}
	if o.Warmup == 0 {
		o.Warmup = 3 * time.Second
	}
	if o.Chunk == 0 {
		o.Chunk = 2 * time.Second
	}
	if o.Cycles == 0 {
		o.Cycles = 30
	}
	if o.Conns == 0 {
		o.Conns = 4
	}
	return o
}

// EnvoyBuildRow is one variant's measurements.
type EnvoyBuildRow struct {
	Name      string
	Bytes     int             // the module
	GzipBytes int             // GzipSize
	Startup   []time.Duration // per start: listener load to every VM started (envoyStartup)
	StartCPU  []time.Duration // per start: Envoy's CPU from exec to ready (/ready LIVE), V8's compiles included
	CPU       []time.Duration // per cycle: Envoy's CPU per request over a chunk at the fixed rate
	RSS       int64           // Envoy's resident memory after the cycles
	VMs       int             // wasm.envoy.wasm.runtime.v8.active
}

// EnvoyBuildCost is what the build steps give in Envoy: each variant of the filter, and
// Envoy without the filter as the baseline.
type EnvoyBuildCost struct {
	Options  EnvoyBuildOptions
	Baseline EnvoyBuildRow // Envoy without the Wasm filter
	Rows     []EnvoyBuildRow
}

// MeasureEnvoyBuild measures variants (built already: wasms[i] is variants[i]'s) in
// o.Release with the shipped envoy.yaml, a real sync service on a Redis it starts, and a
// backend, in two phases. Start-up: o.Starts times, every variant's Envoy and the
// baseline's is started in turn (the order rotated each time), its start-up read from
// its log and its CPU at ready from /proc; the last start of each stays up. CPU: every
// Envoy is warmed up at Rate, then in each of o.Cycles cycles each gets one Chunk at Rate
// in turn (the order rotated by cycle) over keys that stay under their limit, and its CPU
// per request over the chunk is taken from /proc: chunks of the same cycle are seconds
// apart, so other work on the machine weighs on the variants alike, and PairedCPU
// compares them cycle by cycle.
func MeasureEnvoyBuild(variants []BuildVariant, wasms [][]byte, o EnvoyBuildOptions) (EnvoyBuildCost, error) {
	o = o.withDefaults()
	c := EnvoyBuildCost{Options: o, Baseline: EnvoyBuildRow{Name: "Envoy without the filter"}}
	for i, v := range variants {
		c.Rows = append(c.Rows, EnvoyBuildRow{Name: v.Name, Bytes: len(wasms[i]), GzipBytes: GzipSize(wasms[i])})
	}
	srv, err := redistest.Launch(redistest.Options{})
	if err != nil {
		return c, fmt.Errorf("redis: %w", err)
	}
	defer srv.Stop()
	svc, err := StartService(store.Standalone, srv.Addrs())
	if err != nil {
		return c, err
	}
	defer svc.Close()
	backend, stop, err := envoyproc.Upstream()
	if err != nil {
		return c, err
	}
	defer stop()
	dir, err := os.MkdirTemp("", "tollgate-envoy-build-")
	if err != nil {
		return c, err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
	defer cancel()

	n := len(variants) + 1 // the baseline last
	row := func(i int) (*EnvoyBuildRow, []byte) {
		if i < len(variants) {
			return &c.Rows[i], wasms[i]
		}
		return &c.Baseline, wasms[0]
	}
	running := make([]*Envoy, n)
	defer func() {
		for _, e := range running {
			if e != nil {
				e.Stop()
			}
		}
	}()
	for r := 0; r < o.Starts; r++ {
		for k := 0; k < n; k++ {
			i := (k + r) % n
			rw, wasm := row(i)
			if running[i] != nil {
				running[i].Stop()
				running[i] = nil
			}
			e, err := startMeasured(ctx, rw, i == len(variants), wasm, backend, svc.Addr, dir, o)
			if err != nil {
				return c, fmt.Errorf("%s, start %d: %w", rw.Name, r+1, err)
			}
			running[i] = e
		}
	}
	req := func(i int) *http.Request {
		r, _ := http.NewRequest(http.MethodGet, "/orders/"+strconv.Itoa(i%50), nil)
		r.Header.Set("x-api-key", "sk_ent_acme_"+strconv.Itoa(i%100)) // 50,000/min each: never limited
		return r
	}
	for i, e := range running {
		if _, err := Drive(ctx, e.URL, int(o.Rate*o.Warmup.Seconds()), o.Conns, o.Rate, req); err != nil {
			rw, _ := row(i)
			return c, fmt.Errorf("%s: warm-up: %w", rw.Name, err)
		}
	}
	per := int(o.Rate * o.Chunk.Seconds())
	for cy := 0; cy < o.Cycles; cy++ {
		for k := 0; k < n; k++ {
			i := (k + cy) % n
			rw, _ := row(i)
			before, err := ReadProc(running[i].Pid())
			if err != nil {
				return c, err
			}
			status, err := Drive(ctx, running[i].URL, per, o.Conns, o.Rate, req)
			if err != nil {
				return c, fmt.Errorf("%s: %w", rw.Name, err)
			}
			after, err := ReadProc(running[i].Pid())
			if err != nil {
				return c, err
			}
			if status[200] != per {
				return c, fmt.Errorf("%s: statuses %v, want %d × 200", rw.Name, status, per)
			}
			rw.CPU = append(rw.CPU, (after.CPU-before.CPU)/time.Duration(per))
		}
	}
	for i, e := range running {
		rw, _ := row(i)
		p, err := ReadProc(e.Pid())
		if err != nil {
			return c, err
		}
		rw.RSS = p.RSS
	}
	return c, nil
}

// envoyLogFormat stamps Envoy's log lines to the microsecond.
var envoyLogFormat = []string{"--log-format", "[%Y-%m-%d %T.%f][%t][%l][%n] %v"}

// startMeasured starts one Envoy and records its start-up in rw.
func startMeasured(ctx context.Context, rw *EnvoyBuildRow, noFilter bool, wasm []byte, backend, sync, dir string, o EnvoyBuildOptions) (*Envoy, error) {
	e, err := StartEnvoy(ctx, dir, EnvoyOptions{Release: o.Release, Wasm: wasm, Backend: backend, Sync: sync,
		LogLevel: "info", Args: envoyLogFormat, NoFilter: noFilter})
	if err != nil {
		return nil, err
	}
	ready, err := ReadProc(e.Pid())
	if err != nil {
		e.Stop()
		return nil, err
	}
	vms := 0
	if !noFilter {
		st, err := e.Stats(ctx)
		if err != nil {
			e.Stop()
			return nil, err
		}
		if vms = int(st["wasm.envoy.wasm.runtime.v8.active"]); vms == 0 {
			e.Stop()
			return nil, fmt.Errorf("no active V8 VM: %s", e.LogTail(10))
		}
	}
	startup, err := envoyStartup(e.LogPath, noFilter, vms, 10*time.Second)
	if err != nil {
		e.Stop()
		return nil, err
	}
	rw.Startup = append(rw.Startup, startup)
	rw.StartCPU = append(rw.StartCPU, ready.CPU)
	rw.VMs = vms
	return e, nil
}

var (
	logStamp      = regexp.MustCompile(`^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6})\]`)
	listenerLoad  = "loading 1 listener(s)"
	vmStarted     = "tollgate: started with"
	dispatchStart = "starting main dispatch loop"
)

// envoyStartup reads from Envoy's log (envoyLogFormat) the time from the listener's
// load, where the filter's configuration is read, to the last of vms "tollgate:
// started" lines (each VM's proxy_on_configure: the main thread's, then one per
// worker), or, without the filter, to the main dispatch loop's start. It waits up to
// wait for the lines.
func envoyStartup(logPath string, noFilter bool, vms int, wait time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(wait)
	for {
		b, err := os.ReadFile(logPath)
		if err != nil {
			return 0, err
		}
		var from, to time.Time
		seen := 0
		for _, line := range strings.Split(string(b), "\n") {
			m := logStamp.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			t, err := time.Parse("2006-01-02 15:04:05.000000", m[1])
			if err != nil {
				continue
			}
			switch {
			case strings.Contains(line, listenerLoad):
				from = t
			case !noFilter && strings.Contains(line, vmStarted):
				seen++
				to = t
			case noFilter && strings.Contains(line, dispatchStart):
				seen, to = 1, t
			}
		}
		want := vms
		if noFilter {
			want = 1
		}
		if !from.IsZero() && seen >= want && want > 0 {
			return to.Sub(from), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("log: listener load %v, %d of %d start lines", !from.IsZero(), seen, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// BuildStep is a step of the build judged in Envoy: the variants with and without it
// (indexes into EnvoyBuildVariants).
type BuildStep struct {
	Step          string
	With, Without int
	Shipped       bool // the shipped build has the step
}

// EnvoyBuildSteps are the judgements BENCHMARKS.md §12 makes.
var EnvoyBuildSteps = []BuildStep{
	{Step: "`Thread` (jumps of resumable functions taken directly)", With: 0, Without: 1, Shipped: true},
	{Step: "`Pack` (data section DEFLATE-compressed, decoded at each VM's start; line tables dropped)", With: 2, Without: 0},
	{Step: "dropping the file and line tables (inside `Pack`)", With: 2, Without: 3},
}

// StepPays is the threshold a step must reach in per-request CPU or in start-up time.
const StepPays = 0.05

// Median returns the medians of row's CPU per request, start-up and start-up CPU.
func (r EnvoyBuildRow) Median() (cpu, startup, startCPU time.Duration) {
	return medianOf(r.CPU), medianOf(r.Startup), medianOf(r.StartCPU)
}

// MemoryPerVM is the RSS above Envoy without the filter, shared by the active VMs.
func (c EnvoyBuildCost) MemoryPerVM(r EnvoyBuildRow) float64 {
	if r.VMs == 0 {
		return 0
	}
	return float64(r.RSS-c.Baseline.RSS) / float64(r.VMs)
}

// PairedCPU is the median over the cycles of a's CPU per request over b's in the same
// cycle.
func PairedCPU(a, b EnvoyBuildRow) float64 {
	var rs []float64
	for i := range min(len(a.CPU), len(b.CPU)) {
		rs = append(rs, float64(a.CPU[i])/float64(b.CPU[i]))
	}
	sort.Float64s(rs)
	return median(rs)
}

// Gain is what the step saves in per-request CPU (paired by cycle), start-up time and
// start-up CPU, as fractions of the variant without it (negative: the step costs).
func (c EnvoyBuildCost) Gain(s BuildStep) (cpu, startup, startCPU float64) {
	w, wo := c.Rows[s.With], c.Rows[s.Without]
	_, ws, wsc := w.Median()
	_, os, osc := wo.Median()
	return 1 - PairedCPU(w, wo), 1 - float64(ws)/float64(os), 1 - float64(wsc)/float64(osc)
}

// Noise is how far the A/A control (the shipped build in a second Envoy) lands from the
// shipped build in CPU per request (paired), start-up and start-up CPU: a difference
// between two variants no larger than this has not been measured.
func (c EnvoyBuildCost) Noise() (cpu, startup, startCPU float64) {
	if len(c.Rows) <= ControlVariant {
		return 0, 0, 0
	}
	cpu, startup, startCPU = c.Gain(BuildStep{With: ControlVariant, Without: 0})
	return math.Abs(cpu), math.Abs(startup), math.Abs(startCPU)
}

// Pays says whether the step saves at least StepPays, and more than the A/A control's
// Noise, of the CPU per request, or of the start-up in both its time and its CPU (on a
// shared machine the start-up's wall time moves with other work; its CPU does not, and
// a step that saves only one of them has not shown it saves the start-up).
func (c EnvoyBuildCost) Pays(s BuildStep) bool {
	cpu, st, stCPU := c.Gain(s)
	ncpu, nst, nstCPU := c.Noise()
	return (cpu >= StepPays && cpu > ncpu) || (st >= StepPays && st > nst && stCPU >= StepPays && stCPU > nstCPU)
}

func medianOf[T time.Duration | int64](xs []T) T {
	if len(xs) == 0 {
		return 0
	}
	s := append([]T(nil), xs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

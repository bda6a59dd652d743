package perf

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime/pprof"
	"strings"
	"time"
)

// ProfileGuest runs f under the CPU profiler and reports how much of the sampled CPU
// time was spent outside Go code — runtime._ExternalCode, which in this process is the
// wasm module's compiled code (wazero runs it on the goroutine's stack, invisible to
// Go's unwinder) — and the total sampled. It reads the profile with `go tool pprof`.
func ProfileGuest(f func() error) (guest, total time.Duration, err error) {
	tmp, err := os.CreateTemp("", "tollgate-bench-*.pprof")
	if err != nil {
		return 0, 0, fmt.Errorf("profile file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := pprof.StartCPUProfile(tmp); err != nil {
		tmp.Close()
		return 0, 0, fmt.Errorf("start profile: %w", err)
	}
	ferr := f()
	pprof.StopCPUProfile()
	tmp.Close()
	if ferr != nil {
		return 0, 0, ferr
	}
	out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=100000", tmp.Name()).Output()
	if err != nil {
		return 0, 0, fmt.Errorf("go tool pprof: %w", err)
	}
	return parsePprofTop(out)
}

// parsePprofTop reads "Total samples = 3.96s" and the flat time of runtime._ExternalCode
// from `go tool pprof -top` output.
func parsePprofTop(out []byte) (guest, total time.Duration, err error) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if _, rest, ok := strings.Cut(line, "Total samples = "); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				total, _ = time.ParseDuration(f[0])
			}
		}
		if strings.HasSuffix(strings.TrimSpace(line), "runtime._ExternalCode") {
			f := strings.Fields(line)
			if len(f) > 0 {
				guest, _ = time.ParseDuration(f[0])
			}
		}
	}
	if total == 0 {
		return 0, 0, fmt.Errorf("go tool pprof: no total in %q", truncateOut(out))
	}
	return guest, total, nil
}

func truncateOut(b []byte) string {
	if len(b) > 300 {
		b = b[:300]
	}
	return string(b)
}

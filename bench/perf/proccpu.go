package perf

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ProcessCPU is the CPU time a process has used so far, all its threads together, read
// from /proc: the sum of se.sum_exec_runtime over /proc/<pid>/task/*/sched (nanosecond
// resolution), or, where the kernel does not expose sched files, utime + stime of
// /proc/<pid>/stat (10 ms clock ticks). The regime runs compare Redis CPU per check
// between runs of a few seconds at a few hundred requests per second, where a 10 ms
// tick is a large share of what is measured; the sched files are exact to the
// scheduler's accounting. Threads that exited are not counted by the sched sum;
// redis-server's threads (main, bio and lazy-free) live as long as the server.
func ProcessCPU(pid int) (time.Duration, error) {
	if d, err := schedCPU(pid); err == nil {
		return d, nil
	}
	return procCPU(pid)
}

// schedCPU sums se.sum_exec_runtime (milliseconds with six decimals) over the tasks
// of pid.
func schedCPU(pid int) (time.Duration, error) {
	tasks, err := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/sched")
	if err != nil || len(tasks) == 0 {
		return 0, fmt.Errorf("process %d: no sched files", pid)
	}
	var sum time.Duration
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread exited between the glob and the read
		}
		d, err := sumExecRuntime(b)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", f, err)
		}
		sum += d
	}
	return sum, nil
}

// sumExecRuntime reads the se.sum_exec_runtime line of a sched file.
func sumExecRuntime(b []byte) (time.Duration, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(k) != "se.sum_exec_runtime" {
			continue
		}
		ms, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return 0, fmt.Errorf("se.sum_exec_runtime %q: %w", strings.TrimSpace(v), err)
		}
		return time.Duration(ms * 1e6), nil
	}
	return 0, errors.New("no se.sum_exec_runtime line")
}

package main

import (
	"bufio"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
)

// machine describes where the numbers were measured.
type machine struct {
	cpus       int
	maxprocs   int
	model      string
	memory     string
	kernel     string
	goVersion  string
	redis      string
	loadAvg    string // /proc/loadavg at the start: other work on the machine
	depVersion map[string]string
}

func readMachine() machine {
	m := machine{cpus: runtime.NumCPU(), maxprocs: runtime.GOMAXPROCS(0), goVersion: runtime.Version(), depVersion: map[string]string{}}
	m.model = procField("/proc/cpuinfo", "model name")
	if kb, err := strconv.ParseInt(strings.TrimSuffix(procField("/proc/meminfo", "MemTotal"), " kB"), 10, 64); err == nil {
		m.memory = strconv.FormatFloat(float64(kb)/(1<<20), 'f', 1, 64) + " GiB"
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			m.loadAvg = strings.Join(f[:3], " ")
		}
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			m.depVersion[d.Path] = d.Version
		}
	}
	return m
}

// procField returns the value of the first "name : value" line of a /proc file.
func procField(path, name string) string {
	f, err := os.Open(path)
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == name {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

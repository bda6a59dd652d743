package perf

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// RedisInfo is what one INFO says about the work a Redis server has done so far.
type RedisInfo struct {
	// CPU is used_cpu_sys + used_cpu_user in seconds (all threads of the server).
	CPU float64
	// Commands is total_commands_processed; Reads is total_reads_processed (read
	// events: a pipeline arriving in one read counts once).
	Commands, Reads int64
	// Calls is the calls of each command (INFO commandstats, "evalsha", "get", ...).
	Calls map[string]int64
	// Usec is the server time spent in each command (µs, a script's inner commands
	// included in the script's); UsecPerCall the same per call.
	Usec        map[string]int64
	UsecPerCall map[string]float64
	// Version is redis_version.
	Version string
	// PID is the server's process_id; ProcCPU its CPU time so far read from /proc
	// (ProcessCPU), when ProcOK: the server runs on the same machine as the benchmark.
	PID     int
	ProcCPU float64 // seconds
	ProcOK  bool
}

// ReadInfo reads INFO server, cpu, stats and commandstats.
func ReadInfo(ctx context.Context, rdb redis.Cmdable) (RedisInfo, error) {
	s, err := rdb.Info(ctx, "server", "cpu", "stats", "commandstats").Result()
	if err != nil {
		return RedisInfo{}, fmt.Errorf("INFO: %w", err)
	}
	in := parseInfo(s)
	if in.PID > 0 {
		if d, err := ProcessCPU(in.PID); err == nil {
			in.ProcCPU, in.ProcOK = d.Seconds(), true
		}
	}
	return in, nil
}

func parseInfo(s string) RedisInfo {
	in := RedisInfo{Calls: map[string]int64{}, Usec: map[string]int64{}, UsecPerCall: map[string]float64{}}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		switch k {
		case "redis_version":
			in.Version = v
		case "process_id":
			in.PID, _ = strconv.Atoi(v)
		case "used_cpu_sys", "used_cpu_user":
			f, _ := strconv.ParseFloat(v, 64)
			in.CPU += f
		case "total_commands_processed":
			in.Commands, _ = strconv.ParseInt(v, 10, 64)
		case "total_reads_processed":
			in.Reads, _ = strconv.ParseInt(v, 10, 64)
		}
		if name, ok := strings.CutPrefix(k, "cmdstat_"); ok {
			// calls=12,usec=34,usec_per_call=2.83,rejected_calls=0,failed_calls=0
			for _, f := range strings.Split(v, ",") {
				fk, fv, _ := strings.Cut(f, "=")
				switch fk {
				case "calls":
					in.Calls[name], _ = strconv.ParseInt(fv, 10, 64)
				case "usec":
					in.Usec[name], _ = strconv.ParseInt(fv, 10, 64)
				case "usec_per_call":
					in.UsecPerCall[name], _ = strconv.ParseFloat(fv, 64)
				}
			}
		}
	}
	return in
}

// RedisWork is the difference between two INFOs: the work done in between, without
// the INFO commands that measured it.
type RedisWork struct {
	CPU float64 // seconds
	// ProcCPU is the server process's CPU from /proc (seconds), when ProcOK.
	ProcCPU         float64
	ProcOK          bool
	Commands, Reads int64
	Calls           map[string]int64
	Usec            map[string]int64 // server time per command
}

// Since returns the work done between before and in.
func (in RedisInfo) Since(before RedisInfo) RedisWork {
	w := RedisWork{CPU: in.CPU - before.CPU, Commands: in.Commands - before.Commands, Reads: in.Reads - before.Reads,
		Calls: map[string]int64{}, Usec: map[string]int64{}}
	if in.ProcOK && before.ProcOK && in.PID == before.PID {
		w.ProcCPU, w.ProcOK = in.ProcCPU-before.ProcCPU, true
	}
	for k, v := range in.Usec {
		if d := v - before.Usec[k]; d > 0 && k != "info" {
			w.Usec[k] = d
		}
	}
	for k, v := range in.Calls {
		if d := v - before.Calls[k]; d > 0 && k != "info" {
			w.Calls[k] = d
		}
	}
	// The INFO that took the later snapshot is counted in total_commands_processed only
	// after it ran; the earlier one is in the difference.
	w.Commands -= in.Calls["info"] - before.Calls["info"]
	w.Reads -= in.Calls["info"] - before.Calls["info"]
	return w
}

// WholeCPU is the redis-server process's CPU in seconds, all threads and idle work
// included: from /proc when it was readable, else INFO's used_cpu_sys + used_cpu_user
// (the same process time, from getrusage).
func (w RedisWork) WholeCPU() float64 {
	if w.ProcOK {
		return w.ProcCPU
	}
	return w.CPU
}

// Scripts is the script calls (EVALSHA, EVAL, FCALL) in w.
func (w RedisWork) Scripts() int64 {
	return w.Calls["evalsha"] + w.Calls["eval"] + w.Calls["fcall"] + w.Calls["evalsha_ro"] + w.Calls["eval_ro"]
}

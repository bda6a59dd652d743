package wazerohost

import (
	"strconv"
	"strings"
	"sync"
	"time"
)

// LogEntry is one line the plugin logged through proxy_log or wrote to stdout/stderr
// (which Envoy turns into info and error lines).
type LogEntry struct {
	Time    time.Time
	Level   int    // LogTrace .. LogCritical
	Worker  int    // worker VM index; -1 for the configuration canary
	Context uint32 // effective context id of the call that logged
	Message string
}

// String formats the entry like Envoy's "wasm log" lines.
func (e LogEntry) String() string {
	return e.Time.Format("15:04:05.000") + " [" + LevelName(e.Level) + "] wasm log worker=" + strconv.Itoa(e.Worker) + " ctx=" + strconv.FormatUint(uint64(e.Context), 10) + ": " + e.Message
}

// logRing keeps the last n entries.
type logRing struct {
	mu    sync.Mutex
	buf   []LogEntry
	next  int
	full  bool
	total uint64
}

func newLogRing(n int) *logRing {
	if n <= 0 {
		n = 1024
	}
	return &logRing{buf: make([]LogEntry, n)}
}

func (r *logRing) add(e LogEntry) {
	r.mu.Lock()
	r.buf[r.next] = e
	r.next++
	r.total++
	if r.next == len(r.buf) {
		r.next = 0
		r.full = true
	}
	r.mu.Unlock()
}

func (r *logRing) entries() []LogEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.full {
		return append([]LogEntry(nil), r.buf[:r.next]...)
	}
	out := make([]LogEntry, 0, len(r.buf))
	out = append(out, r.buf[r.next:]...)
	return append(out, r.buf[:r.next]...)
}

// since returns the entries logged after the ring had seen mark entries in total.
func (r *logRing) since(mark uint64) []LogEntry {
	all := r.entries()
	r.mu.Lock()
	n := r.total - mark
	r.mu.Unlock()
	if n > uint64(len(all)) {
		n = uint64(len(all))
	}
	return all[len(all)-int(n):]
}

func (r *logRing) mark() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total
}

// joinLogs renders entries for an error message.
func joinLogs(entries []LogEntry) string {
	if len(entries) == 0 {
		return "(the plugin logged nothing)"
	}
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(LevelName(e.Level))
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	return b.String()
}

// stdWriter turns a module's stdout or stderr into log entries, as Envoy's fd_write does
// (stdout at info, stderr at error, one trailing newline trimmed per write).
type stdWriter struct {
	vm    *vm
	level int
}

func (w stdWriter) Write(p []byte) (int, error) {
	s := strings.TrimSuffix(string(p), "\n")
	if s != "" {
		w.vm.host.log(w.vm, w.level, s)
	}
	return len(p), nil
}

// Logs returns the most recent plugin log lines, oldest first.
func (h *Host) Logs() []LogEntry { return h.logs.entries() }

// log records one plugin log line on behalf of the context running on v. The caller
// holds v.mu.
func (h *Host) log(v *vm, level int, msg string) {
	var id uint32
	if c := v.active(); c != nil {
		id = c.id
	}
	h.logAt(v.index, id, level, msg)
}

// logAt records one log line without looking at a VM (callers that do not hold it).
func (h *Host) logAt(worker int, ctxID uint32, level int, msg string) {
	if level < h.cfg.LogLevel {
		return
	}
	h.logs.add(LogEntry{Time: time.Now(), Level: level, Worker: worker, Context: ctxID, Message: msg})
	if h.cfg.Log != nil {
		h.cfg.Log(level, msg)
	}
}

// logsOf returns worker v's log lines logged since mark.
func (h *Host) logsOf(v *vm, mark uint64) []LogEntry {
	var out []LogEntry
	for _, e := range h.logs.since(mark) {
		if e.Worker == v.index {
			out = append(out, e)
		}
	}
	return out
}

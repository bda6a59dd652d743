package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// accessLog writes one line per finished stream, as Envoy's file access log does.
type accessLog struct {
	format *wazerohost.AccessLogFormat
	mu     sync.Mutex
	w      *bufio.Writer
	c      io.Closer // nil for stdout
	buf    []byte
	// flushing: a write was made since the last flush (flushed by a timer, so a reader
	// of the file sees a line within flushEvery without a write per request).
	flushing bool
}

const flushEvery = 100 * time.Millisecond

func openAccessLog(path, format string) (*accessLog, error) {
	f, err := wazerohost.ParseAccessLogFormat(format)
	if err != nil {
		return nil, fmt.Errorf("--access-log-format: %w", err)
	}
	a := &accessLog{format: f}
	if path == "-" {
		a.w = bufio.NewWriter(os.Stdout)
		return a, nil
	}
	file, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("--access-log: %w", err)
	}
	a.w, a.c = bufio.NewWriter(file), file
	return a, nil
}

// write is wazerohost.Config.OnStreamDone: it runs with a VM locked, so it only formats
// into a buffer; a timer flushes.
func (a *accessLog) write(e wazerohost.AccessEntry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.buf = a.format.Append(a.buf[:0], &e, time.Now())
	_, _ = a.w.Write(a.buf)
	if !a.flushing {
		a.flushing = true
		time.AfterFunc(flushEvery, a.flush)
	}
}

func (a *accessLog) flush() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.flushing = false
	_ = a.w.Flush()
}

// Close flushes and closes the file.
func (a *accessLog) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	err := a.w.Flush()
	if a.c != nil {
		if cerr := a.c.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

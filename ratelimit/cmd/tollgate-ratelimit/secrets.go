package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
)

// secret is one credential of the service (sync secret, admin token, Redis password),
// given either as a value (flag or environment) or as a file. A file is read at start
// and again on every reload (SIGHUP), so a Kubernetes Secret mounted as a file can be
// rotated without a restart; a value is fixed for the life of the process.
//
// A file holds one value per line; blank lines and surrounding white space (the newline
// editors add) are ignored. Secrets that accept several values (multi) take every line,
// so a rotation can overlap: add the new one, move the clients, drop the old one.
type secret struct {
	name  string // for logs and metrics: sync, admin, redis
	flag  string // the value flag, for messages
	value string
	file  string
	multi bool

	cur atomic.Pointer[[]string]
}

// errSecretFile wraps why a secret file cannot be used. The message names the file,
// never its content.
var errSecretFile = errors.New("secret file")

// readSecretFile reads path's values. A missing, unreadable or empty file is an error:
// an empty secret would either open an endpoint or lock every client out.
func readSecretFile(path string, multi bool) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		// The *PathError names the path and the reason only.
		return nil, fmt.Errorf("%w: %w", errSecretFile, err)
	}
	var vals []string
	for _, line := range strings.Split(string(b), "\n") {
		if v := strings.TrimSpace(line); v != "" {
			vals = append(vals, v)
		}
	}
	switch {
	case len(vals) == 0:
		return nil, fmt.Errorf("%w: %q is empty", errSecretFile, path)
	case len(vals) > 1 && !multi:
		return nil, fmt.Errorf("%w: %q holds %d lines, want one", errSecretFile, path, len(vals))
	}
	return vals, nil
}

// load sets the secret at start: from its file when one is named (an error if the
// value is given too: which one wins would be a guess), else from its value.
func (s *secret) load() error {
	if s.file == "" {
		vals := []string{}
		if s.value != "" {
			vals = append(vals, s.value)
		}
		s.cur.Store(&vals)
		return nil
	}
	if s.value != "" {
		return fmt.Errorf("--%s and --%s-file both set: give one", s.flag, s.flag)
	}
	vals, err := readSecretFile(s.file, s.multi)
	if err != nil {
		return fmt.Errorf("--%s-file: %w", s.flag, err)
	}
	s.cur.Store(&vals)
	return nil
}

// reload reads the file again. It reports whether anything was read (false for a
// secret given as a value) and, on failure, keeps the previous values.
func (s *secret) reload() (changed bool, err error) {
	if s.file == "" {
		return false, nil
	}
	vals, err := readSecretFile(s.file, s.multi)
	if err != nil {
		return false, err
	}
	old := s.cur.Swap(&vals)
	return old == nil || !equal(*old, vals), nil
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// values is the secret's current values (none when unset).
func (s *secret) values() []string {
	if p := s.cur.Load(); p != nil {
		return *p
	}
	return nil
}

// first is the secret's current value, or "".
func (s *secret) first() string {
	if v := s.values(); len(v) > 0 {
		return v[0]
	}
	return ""
}

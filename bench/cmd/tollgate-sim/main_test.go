package main

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestRunDeterministic(t *testing.T) {
	args := []string{"-traffic", "bursty", "-duration", "2s", "-loss", "0.02", "-outage", "1s:500ms", "-sweep", "gateways=1,3"}
	var a, b bytes.Buffer
	if err := run(args, &a, io.Discard); err != nil {
		t.Fatal(err)
	}
	if err := run(args, &b, io.Discard); err != nil {
		t.Fatal(err)
	}
	if a.String() != b.String() {
		t.Fatalf("same flags, different tables:\n%s\n%s", a.String(), b.String())
	}
	lines := strings.Split(strings.TrimSpace(a.String()), "\n")
	if len(lines) != 5 { // settings, outage, header, two rows
		t.Fatalf("want 5 lines, got %d:\n%s", len(lines), a.String())
	}
}

func TestRunBadFlags(t *testing.T) {
	cases := []struct {
		name string
		args []string
	}{
		{"unknown traffic", []string{"-traffic", "flood"}},
		{"unknown sweep", []string{"-sweep", "colour=red"}},
		{"sweep without values", []string{"-sweep", "gateways"}},
		{"bad sweep value", []string{"-sweep", "interval=fast"}},
		{"bad latency", []string{"-latency", "soon"}},
		{"bad outage", []string{"-outage", "5s"}},
		{"invalid config", []string{"-loss", "2"}},
		{"unknown algorithm", []string{"-algo", "leaky"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := run(tc.args, io.Discard, io.Discard); err == nil {
				t.Fatal("accepted")
			}
		})
	}
	if err := run([]string{"-sweep", "colour=red"}, io.Discard, io.Discard); !errors.Is(err, errSweep) {
		t.Fatalf("unknown sweep: %v, want errSweep", err)
	}
}

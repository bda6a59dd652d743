package main

import (
	"io"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/tollgate-rl/tollgate/bench/perf"
)

func TestRunRefusesBadFlags(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"negative scale", []string{"-scale", "-1"}, "must be positive"},
		{"zero scale", []string{"-scale", "0"}, "must be positive"},
		{"zero regime keys", []string{"-regime-keys", "0"}, "must be positive"},
		{"unknown section", []string{"-sections", "all"}, `unknown section "all"`},
		{"stray argument", []string{"extra"}, `unexpected argument "extra"`},
		{"unknown flag", []string{"-nope"}, "flag provided but not defined"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := run(c.args, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("run(%q) = %v, want an error containing %q", c.args, err, c.want)
			}
		})
	}
}

func TestFormatting(t *testing.T) {
	cases := []struct {
		name, got, want string
	}{
		{"int", fmtInt(1234567), "1,234,567"},
		{"small int", fmtInt(999), "999"},
		{"negative int", fmtInt(-1234.4), "-1,234"},
		{"µs", fmtDur(1500 * time.Nanosecond), "1.5 µs"},
		{"ms", fmtDur(2500 * time.Microsecond), "2.50 ms"},
		{"s", fmtDur(1500 * time.Millisecond), "1.50 s"},
		{"ratio below one", fmtRatio(0.01), "1/100"},
		{"ratio above one", fmtRatio(2.04), "2.0×"},
		{"no ratio", fmtRatio(0), "n/a"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.got != c.want {
				t.Fatalf("got %q, want %q", c.got, c.want)
			}
		})
	}
}

func TestHTTPMedianRound(t *testing.T) {
	round := func(pass, floor, tg float64) httpRound {
		return httpRound{pass: perf.LoadResult{ChecksPerSec: pass}, floor: perf.LoadResult{ChecksPerSec: floor}, tollgate: perf.LoadResult{ChecksPerSec: tg}}
	}
	cases := []struct {
		name   string
		rounds []httpRound
		median float64 // the median round's filter share
		note   string
	}{
		{"none", nil, 0, ""},
		{"one round, no note", []httpRound{round(100, 90, 70)}, 0.70, ""},
		{"median by share, not by requests/s", []httpRound{round(100, 95, 63), round(200, 190, 162), round(150, 140, 105)}, 0.70,
			"; median of 3 interleaved rounds: the filter 63, 81, 70 %, the floor module 95, 95, 93 %"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := &report{httpRounds: c.rounds}
			if got := r.httpMedian().share(); got != c.median {
				t.Fatalf("median share %v, want %v", got, c.median)
			}
			if got := r.httpRoundsNote(); got != c.note {
				t.Fatalf("note %q, want %q", got, c.note)
			}
		})
	}
}

// TestTemplateFuncs: the formatters the section templates call, as a template calls them.
func TestTemplateFuncs(t *testing.T) {
	cases := []struct {
		tmpl string
		data any
		want string
	}{
		{"{{int .}}", 1234567.4, "1,234,567"},
		{"{{int .}}", int64(-1234), "-1,234"},
		{"{{int .}}", 42, "42"},
		{"{{f 2 .}}", 1.005, "1.00"},
		{"{{f 0 .}}", 7, "7"},
		{"{{dur .}}", 1500 * time.Microsecond, "1.50 ms"},
		{"{{sdur .}}", -850 * time.Microsecond, "−850.0 µs"},
		{"{{times .}}", 0.02, "1/50"},
		{"{{pct 0 .}}", 0.845, "84 %"},
		{"{{spct 1 .}}", 0.015, "+1.5 %"},
		{"{{spct 1 .}}", -0.2, "-20.0 %"},
		{"{{g .}}", 0.05, "0.05"},
		{"{{met .}}", true, "**met**"},
		{"{{met .}}", false, "**missed**"},
	}
	for _, c := range cases {
		t.Run(c.tmpl+"/"+c.want, func(t *testing.T) {
			var b strings.Builder
			tm := template.Must(template.New("").Funcs(templateFuncs).Parse(c.tmpl))
			if err := tm.Execute(&b, c.data); err != nil {
				t.Fatal(err)
			}
			if b.String() != c.want {
				t.Fatalf("got %q, want %q", b.String(), c.want)
			}
		})
	}
	// A number of a kind the views do not hold is the template's mistake, an error.
	tm := template.Must(template.New("").Funcs(templateFuncs).Parse("{{int .}}"))
	if err := tm.Execute(io.Discard, "12"); err == nil {
		t.Fatal("no error for a string")
	}
}

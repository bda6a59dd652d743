package perf

import (
	"testing"
	"time"
)

func TestParseInfo(t *testing.T) {
	info := "# Server\r\nredis_version:7.0.15\r\n# CPU\r\nused_cpu_sys:1.50\r\nused_cpu_user:2.25\r\n" +
		"# Stats\r\ntotal_commands_processed:1234\r\ntotal_reads_processed:99\r\n" +
		"# Commandstats\r\ncmdstat_evalsha:calls=10,usec=45,usec_per_call=4.50,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=3,usec=300,usec_per_call=100.00,rejected_calls=0,failed_calls=0\r\n"
	in := parseInfo(info)
	cases := []struct {
		name      string
		got, want any
	}{
		{"version", in.Version, "7.0.15"},
		{"cpu", in.CPU, 3.75},
		{"commands", in.Commands, int64(1234)},
		{"reads", in.Reads, int64(99)},
		{"evalsha calls", in.Calls["evalsha"], int64(10)},
		{"evalsha usec per call", in.UsecPerCall["evalsha"], 4.5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.got != c.want {
				t.Fatalf("got %v, want %v", c.got, c.want)
			}
		})
	}
	t.Run("since drops the measuring INFOs", func(t *testing.T) {
		later := parseInfo(info)
		later.Commands += 2 + 1 // two commands and the INFO that took this snapshot
		later.Calls["info"]++
		later.Calls["get"] = 2
		w := later.Since(in)
		if w.Commands != 2 || w.Calls["get"] != 2 || w.Calls["info"] != 0 {
			t.Fatalf("work %+v", w)
		}
	})
}

func TestParsePprofTop(t *testing.T) {
	cases := []struct {
		name         string
		out          string
		guest, total time.Duration
		err          bool
	}{
		{"typical", "File: perf.test\nDuration: 4.03s, Total samples = 3.96s (98.23%)\n      flat  flat%   sum%        cum   cum%\n     1.94s 48.99% 48.99%      1.94s 48.99%  runtime._ExternalCode\n", 1940 * time.Millisecond, 3960 * time.Millisecond, false},
		{"milliseconds", "Duration: 1s, Total samples = 800ms (80%)\n     650ms 81.25% 81.25%      650ms 81.25%  runtime._ExternalCode\n", 650 * time.Millisecond, 800 * time.Millisecond, false},
		{"no guest code", "Duration: 1s, Total samples = 800ms (80%)\n     650ms 81.25% 81.25%      650ms 81.25%  main.main\n", 0, 800 * time.Millisecond, false},
		{"not a profile", "oops", 0, 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, tot, err := parsePprofTop([]byte(c.out))
			if (err != nil) != c.err || g != c.guest || tot != c.total {
				t.Fatalf("parsePprofTop = %v, %v, %v; want %v, %v, error %v", g, tot, err, c.guest, c.total, c.err)
			}
		})
	}
}

func FuzzParseInfo(f *testing.F) {
	f.Add("used_cpu_sys:1.5\r\ncmdstat_get:calls=3,usec=9\r\n")
	f.Add("cmdstat_:calls=,=\r\n:::\r\n")
	f.Fuzz(func(t *testing.T, s string) {
		in := parseInfo(s)
		_ = in.Since(parseInfo(s))
	})
}

func FuzzParsePprofTop(f *testing.F) {
	f.Add([]byte("Total samples = 3s (1%)\n 1s 1% 1% 1s 1% runtime._ExternalCode\n"))
	f.Add([]byte("Total samples = \n runtime._ExternalCode"))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, tot, err := parsePprofTop(b)
		if err == nil && tot == 0 {
			t.Fatalf("no error but total 0 (guest %v)", g)
		}
	})
}

func TestHumanCount(t *testing.T) {
	cases := []struct {
		in   float64
		want string
	}{
		{0, "0"}, {0.25, "0.25"}, {950, "950"}, {1000, "1k"}, {12345, "12.3k"}, {1_000_000, "1M"}, {4_300_000, "4.3M"},
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			if got := humanCount(c.in); got != c.want {
				t.Fatalf("humanCount(%v) = %q, want %q", c.in, got, c.want)
			}
		})
	}
}

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestImportEnvoyRateLimit: `rules import-envoy-ratelimit` prints or applies the
// conversion of an envoyproxy/ratelimit configuration, names every part it cannot
// convert by its YAML path (exit 1, nothing printed or applied unless --partial), and
// applies through the real admin API.
func TestImportEnvoyRateLimit(t *testing.T) {
	svc, url := startService(t)
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fixture := filepath.Join("..", "..", "rlsimport", "testdata", "envoy-ratelimit.yaml")
	mixed := write("mixed.yaml", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: year, requests_per_unit: 5}\n"+
		"  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	rulesIn := func() int {
		c := svc.RuleSet(context.Background())
		if c == nil {
			return 0
		}
		return len(c.Rules)
	}
	env := map[string]string{"TOLLGATE_SERVER": url, "TOLLGATE_ADMIN_TOKEN": token}
	for _, tt := range []struct {
		name   string
		args   []string
		code   int
		stdout []string
		stderr []string
		rules  int // rules the service holds afterwards (0: as many as before)
	}{
		{"print", []string{"rules", "import-envoy-ratelimit", fixture}, 0,
			[]string{`"id": "per_user"`, `"except": [`, `"replaces": [`, `"shadow": true`},
			[]string{"envoy-ratelimit.yaml: descriptors[8].detailed_metric (line 66): note: dropped"}, 0},
		{"problem named, nothing printed", []string{"rules", "import-envoy-ratelimit", mixed}, 1, nil,
			[]string{"mixed.yaml: descriptors[0].rate_limit.unit (line 4): cannot convert: a year (365 days) is longer than Tollgate's longest window (31d)",
				"1 part(s) cannot be converted; nothing printed"}, 0},
		{"problem named, nothing applied", []string{"rules", "import-envoy-ratelimit", "--apply", mixed}, 1, nil,
			[]string{"descriptors[0].rate_limit.unit (line 4): cannot convert", "nothing applied"}, 0},
		{"partial prints the rest", []string{"rules", "import-envoy-ratelimit", "--partial", mixed}, 1,
			[]string{`"id": "d.b"`}, []string{"descriptors[0].rate_limit.unit (line 4): cannot convert"}, 0},
		{"apply", []string{"rules", "import-envoy-ratelimit", "--apply", fixture}, 0,
			[]string{"applied ", "(converted): rules version "}, nil, 8},
		{"not YAML", []string{"rules", "import-envoy-ratelimit", write("bad.yaml", "domain: [")}, 1, nil,
			[]string{"bad.yaml: document: cannot convert: not YAML"}, 0},
		{"no file", []string{"rules", "import-envoy-ratelimit"}, 2, nil, []string{"want \"tollgate rules import-envoy-ratelimit"}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := rulesIn()
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), tt.args, func(k string) string { return env[k] }, strings.NewReader(""), &stdout, &stderr)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout.String(), stderr.String())
			}
			if tt.stdout == nil && stdout.Len() > 0 {
				t.Errorf("stdout not empty:\n%s", stdout.String())
			}
			for _, c := range []struct {
				name, got string
				want      []string
			}{{"stdout", stdout.String(), tt.stdout}, {"stderr", stderr.String(), tt.stderr}} {
				for _, w := range c.want {
					if !strings.Contains(c.got, w) {
						t.Errorf("%s lacks %q:\n%s", c.name, w, c.got)
					}
				}
			}
			if tt.rules == 0 {
				tt.rules = before
			}
			if n := rulesIn(); n != tt.rules {
				t.Errorf("service holds %d rules, want %d", n, tt.rules)
			}
		})
	}
}

package rlsimport

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/rule"
)

var update = flag.Bool("update", false, "rewrite testdata/*.json from the converter")

// TestConvertFixture: the fixture converts without a problem into the rule set in
// testdata/envoy-ratelimit.json (reviewed by hand; -update rewrites it), which parses.
func TestConvertFixture(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "envoy-ratelimit.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	res := Convert(data)
	if len(res.Problems) > 0 {
		t.Fatalf("problems: %v", res.Problems)
	}
	wantNotes := []Issue{{"descriptors[8].detailed_metric", "dropped: Tollgate counts decisions per rule"}}
	checkIssues(t, "notes", res.Notes, wantNotes)
	golden := filepath.Join("testdata", "envoy-ratelimit.json")
	if *update {
		if err := os.WriteFile(golden, res.Rules, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(res.Rules, want) {
		t.Errorf("converted:\n%s\nwant (%s):\n%s", res.Rules, golden, want)
	}
	if _, err := rule.Parse(res.Rules); err != nil {
		t.Fatal(err)
	}
}

// checkIssues compares issues by path and a part of the message, in order.
func checkIssues(t *testing.T, what string, got, want []Issue) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
	for i := range want {
		if got[i].Path != want[i].Path || !strings.Contains(got[i].Msg, want[i].Msg) {
			t.Errorf("%s[%d] = %v, want path %q with %q", what, i, got[i], want[i].Path, want[i].Msg)
		}
	}
}

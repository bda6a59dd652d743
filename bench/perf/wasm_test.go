package perf

import (
	"strings"
	"testing"
)

// TestBuildAtRevisionNamesWhatIsMissing: a revision the history does not hold is an
// error that names it, which the report prints instead of the first version's rows.
func TestBuildAtRevisionNamesWhatIsMissing(t *testing.T) {
	_, err := BuildAtRevision("0000000000000000000000000000000000000bad", FloorPkg)
	if err == nil || !strings.Contains(err.Error(), "git archive 0000000000000000000000000000000000000bad") {
		t.Fatalf("got %v, want an error naming the revision", err)
	}
}

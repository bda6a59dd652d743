package perf

import "testing"

func TestShippedBefore(t *testing.T) {
	m, err := ShippedAtRevision(BeforeResponseCost, FilterPkg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d bytes", len(m[FilterPkg]))
}

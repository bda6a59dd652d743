package main

import (
	"strings"
	"testing"
)

// TestSpliceReadmeRows: the real-Envoy rows replace their previous version at the end
// of the measured table and leave the other rows alone; twice is the same as once.
func TestSpliceReadmeRows(t *testing.T) {
	doc := "intro\n" + readmeBegin + "\n\nFrom the run.\n\n|  |  |\n|---|---|\n| a | 1 |\n| in Envoy: old | 0 |\n| b | 2 |\n\n" + readmeEnd + "\nafter\n"
	rows := [][]string{{"in Envoy: x", "1 — met"}, {"in Envoy: y", "2 — missed"}}
	got, err := spliceReadmeRows(doc, rows)
	if err != nil {
		t.Fatal(err)
	}
	want := "intro\n" + readmeBegin + "\n\nFrom the run.\n\n|  |  |\n|---|---|\n| a | 1 |\n| b | 2 |\n| in Envoy: x | 1 — met |\n| in Envoy: y | 2 — missed |\n\n" + readmeEnd + "\nafter\n"
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	again, err := spliceReadmeRows(got, rows)
	if err != nil || again != got {
		t.Fatalf("second splice changed the document: %v\n%s", err, again)
	}
	if _, err := spliceReadmeRows(strings.ReplaceAll(doc, readmeEnd, ""), rows); err == nil {
		t.Fatal("no error without the end marker")
	}
}

package main

import "testing"

// -envoy-build-only rewrites its section and leaves the rest of the report byte for byte.
func TestSpliceSection(t *testing.T) {
	const sec = "## 12. Build steps in Envoy\n\nnew\n"
	for _, tc := range []struct{ name, doc, want string }{
		{"appended when missing", "# R\n\n## 9. Notes\n\nx\n", "# R\n\n## 9. Notes\n\nx\n\n" + sec},
		{"replaced at the end", "# R\n\n## 12. Build steps in Envoy\n\nold\nold\n", "# R\n\n" + sec},
		{"replaced before the next section", "# R\n\n## 12. Build steps in Envoy\n\nold\n\n## 13. Next\n\ny\n", "# R\n\n" + sec + "\n## 13. Next\n\ny\n"},
		{"empty report", "", "\n\n" + sec},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(spliceSection([]byte(tc.doc), envoyBuildHeading, []byte(sec))); got != tc.want {
				t.Errorf("got\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}

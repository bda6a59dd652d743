package rule

import "testing"

// The cold_start fixtures join parseErrorCases, so TestParseErrors checks them and
// TestParseErrorFixturesListed keeps them in step with testdata/.
func init() {
	for _, c := range []struct{ fixture, field, msg string }{
		{"cold_start_unknown.json", "rules[0].cold_start", `must be "bounded", "wait" or "admit", got "fast"`},
		{"cold_start_not_string.json", "rules[0].cold_start", `"bounded", "wait" or "admit"`},
		{"cold_start_admit_on_strict.json", "rules[0].cold_start", `cannot be "admit" on a "strict" rule`},
	} {
		parseErrorCases = append(parseErrorCases, struct {
			fixture string
			field   string
			msg     string
		}{c.fixture, c.field, c.msg})
	}
}

func TestParseColdStart(t *testing.T) {
	tests := []struct {
		name, field string
		want        ColdStart
	}{
		{"default", ``, ColdBounded},
		{"bounded", `,"cold_start":"bounded"`, ColdBounded},
		{"wait", `,"cold_start":"wait"`, ColdWait},
		{"admit", `,"cold_start":"admit"`, ColdAdmit},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(`{"rules":[{"id":"r","limit":10,"window":"1m"` + tt.field + `}]}`))
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Rules[0].ColdStart; got != tt.want {
				t.Fatalf("cold_start %v, want %v", got, tt.want)
			}
			if tt.field != "" && "\""+c.Rules[0].ColdStart.String()+"\"" != tt.field[len(`,"cold_start":`):] {
				t.Fatalf("String() %q does not spell %s", c.Rules[0].ColdStart.String(), tt.field)
			}
		})
	}
}

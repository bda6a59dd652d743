package rule

import (
	"testing"
)

// The max_in_flight fixtures join parseErrorCases, so TestParseErrors checks them and
// TestParseErrorFixturesListed keeps them in step with testdata/.
func init() {
	for _, c := range []struct{ fixture, field, msg string }{
		{"max_in_flight_zero.json", "rules[0].max_in_flight", "must be > 0, got 0"},
		{"max_in_flight_not_integer.json", "rules[0].max_in_flight", "must be an integer, got 2.5"},
		{"max_in_flight_above_maximum.json", "rules[0].max_in_flight", "must be <= 1000000, got 1000001"},
		{"max_in_flight_with_descriptors.json", "rules[0].max_in_flight", `cannot be combined with "descriptors"`},
		{"max_in_flight_only_with_overrides.json", "rules[0].overrides", `needs a rate limit ("limit" and "window", or "windows"); the rule has only "max_in_flight"`},
	} {
		parseErrorCases = append(parseErrorCases, struct {
			fixture string
			field   string
			msg     string
		}{c.fixture, c.field, c.msg})
	}
}

func TestParseMaxInFlight(t *testing.T) {
	c, err := Parse(readFixture(t, "valid_max_in_flight.json"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		r        *Rule
		inFlight int64
		windows  int
	}{
		{"concurrency only", &c.Rules[0], 20, 0},
		{"with a rate limit", &c.Rules[1], 2, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.r.MaxInFlight != tt.inFlight || len(tt.r.Windows) != tt.windows {
				t.Errorf("max_in_flight %d, %d windows; want %d, %d", tt.r.MaxInFlight, len(tt.r.Windows), tt.inFlight, tt.windows)
			}
		})
	}
	t.Run("applies without windows", func(t *testing.T) {
		got := c.Apply(&Request{Method: "POST", Path: "/v1/chat", Header: func(n string) (string, bool) {
			return "k1", n == "x-api-key"
		}}, nil)
		if len(got) != 1 || got[0].Rule.ID != "streams" || got[0].Key != "k1" || len(got[0].Windows) != 0 {
			t.Errorf("Apply = %+v, want the streams rule for k1 without windows", got)
		}
	})
	t.Run("still needs a limit without it", func(t *testing.T) {
		_, err := Parse([]byte(`{"rules":[{"id":"a"}]}`))
		if err == nil {
			t.Fatal("a rule with neither limit nor max_in_flight parsed")
		}
	})
	t.Run("strict false is fine", func(t *testing.T) {
		if _, err := Parse([]byte(`{"rules":[{"id":"a","max_in_flight":3,"strict":false}]}`)); err != nil {
			t.Fatal(err)
		}
	})
}

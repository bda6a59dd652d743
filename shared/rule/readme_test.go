package rule

import (
	"os"
	"strings"
	"testing"
)

// TestREADMEExampleParses keeps the configuration example in README.md honest.
func TestREADMEExampleParses(t *testing.T) {
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	start := strings.Index(doc, "```json\n")
	if start < 0 {
		t.Fatal("README.md has no json example")
	}
	doc = doc[start+len("```json\n"):]
	example := doc[:strings.Index(doc, "```")]
	c, err := Parse([]byte(example))
	if err != nil {
		t.Fatalf("README example: %v", err)
	}
	if len(c.Rules) != 7 || c.RuleByID("login") == nil || !c.RuleByID("login").Strict ||
		c.RuleByID("llm-tokens") == nil || c.RuleByID("llm-tokens").CostFrom == nil {
		t.Fatalf("README example parsed to %d rules", len(c.Rules))
	}
}

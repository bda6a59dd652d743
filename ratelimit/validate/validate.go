// Package validate checks a rule-set file offline, with the parser the admin API, the
// sync path and the filter use (shared/rule): the `rules validate` command of both
// tollgate-ratelimit and the tollgate CLI, so the two say the same thing about a file.
package validate

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/tollgate-rl/tollgate/ratelimit/service"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/rule"
)

// File checks the rule set in the file name (JSON, or YAML when the name ends in .yaml
// or .yml or the document does not start with "{"; "-" reads stdin). It prints a
// one-line summary to stdout and returns 0 when PUT /v1/rules would accept it; prints
// every error with its JSON path to stderr and returns 1 otherwise; returns 2 when the
// file cannot be read (prog prefixes that message).
func File(prog, name string, stdin io.Reader, stdout, stderr io.Writer) int {
	data, err := Read(name, stdin)
	if err != nil {
		fmt.Fprintln(stderr, prog+":", err)
		return 2
	}
	js, err := JSON(name, data)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	cfg, err := rule.Parse(js)
	if err != nil {
		for _, fe := range rule.All(err) {
			fmt.Fprintf(stderr, "%s: %v\n", name, fe)
		}
		var es *rule.Errors
		if errors.As(err, &es) && es.Truncated {
			fmt.Fprintf(stderr, "%s: more than %d errors; fix these and run again\n", name, rule.MaxErrors)
		}
		return 1
	}
	fmt.Fprintln(stdout, summary(name, cfg))
	return 0
}

// Read reads a rule-set file of at most rule.MaxConfigSize bytes ("-": stdin); one byte
// more is read, so the parser reports the size.
func Read(name string, stdin io.Reader) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(io.LimitReader(stdin, rule.MaxConfigSize+1))
	}
	return readCapped(name)
}

// JSON converts a rule-set document to JSON as the admin API does, taking a .yaml or
// .yml name as a YAML hint.
func JSON(name string, data []byte) ([]byte, error) {
	lower := strings.ToLower(name)
	return service.RuleSetJSON(data, strings.HasSuffix(lower, ".yaml") || strings.HasSuffix(lower, ".yml"))
}

// readCapped reads a file of at most rule.MaxConfigSize bytes (one more is read, so the
// parser reports the size).
func readCapped(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, rule.MaxConfigSize+1))
}

// summary is the one line printed for a valid rule set.
func summary(name string, c *rule.Config) string {
	windows, longest, largest := 0, int64(0), int64(0)
	each := func(ws []algo.Params) {
		for _, w := range ws {
			windows++
			longest, largest = max(longest, w.WindowUs), max(largest, w.Limit)
		}
	}
	for i := range c.Rules {
		r := &c.Rules[i]
		each(r.Windows)
		for _, ws := range r.Tiers {
			each(ws)
		}
		for _, o := range r.Overrides {
			each(o.Windows)
		}
	}
	return fmt.Sprintf("%s: valid: %d rules, %d windows (largest limit %d, longest window %s), %d tiers, %d allow and %d deny entries",
		name, len(c.Rules), windows, largest, rule.FormatWindow(longest), len(c.Tiers), len(c.Allow), len(c.Deny))
}

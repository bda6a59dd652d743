package main

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

const validateUsage = `usage: tollgate-ratelimit rules validate FILE

Checks a rule set (JSON, or YAML when FILE ends in .yaml or .yml or does not start
with "{") offline, with the parser the admin API, the sync path and the filter use:
exit 0 and a one-line summary when PUT /v1/rules would accept it, exit 1 and every
error with its JSON path otherwise ("-" reads standard input).
`

// runRules runs the "rules" subcommands; it returns the exit code.
func runRules(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) != 2 || args[0] != "validate" {
		fmt.Fprint(stderr, validateUsage)
		return 2
	}
	name := args[1]
	var data []byte
	var err error
	if name == "-" {
		data, err = io.ReadAll(io.LimitReader(stdin, rule.MaxConfigSize+1))
	} else {
		data, err = readCapped(name)
	}
	if err != nil {
		fmt.Fprintln(stderr, "tollgate-ratelimit:", err)
		return 2
	}
	lower := strings.ToLower(name)
	js, err := service.RuleSetJSON(data, strings.HasSuffix(lower, ".yaml") || strings.HasSuffix(lower, ".yml"))
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

package main

import (
	"fmt"
	"io"

	"github.com/tollgate-rl/tollgate/ratelimit/validate"
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
	return validate.File("tollgate-ratelimit", args[1], stdin, stdout, stderr)
}

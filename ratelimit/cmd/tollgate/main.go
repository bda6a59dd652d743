// Command tollgate is the operator's command line for a Tollgate sync service: it
// validates rule sets offline and talks to the service's admin API to apply, compare,
// list and roll back rule sets, show and reset a caller key's buckets, and list a
// rule's hot keys.
//
//	tollgate [--server URL] [--timeout D] COMMAND ARGS
//
// The server comes from --server or TOLLGATE_SERVER (default http://127.0.0.1:8082, the
// service's default admin listener); the admin token from TOLLGATE_ADMIN_TOKEN, or a
// file named by --admin-token-file or TOLLGATE_ADMIN_TOKEN_FILE — never a flag value,
// which the process list would show. Every failure prints one clear line per problem
// and exits non-zero: 1 when the service or the file said no (unreachable, 401, 422
// with the field named), 2 for a wrong command line.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr))
}

const usage = `usage: tollgate [--server URL] [--timeout D] [--reason TEXT] COMMAND ARGS

Commands:
  rules validate FILE      check a rule set offline (JSON or YAML; "-" reads stdin)
  rules apply FILE         make FILE the service's rule set (a new version)
  rules diff FILE          what applying FILE would change (exit 1 when it would)
  rules history            the rule-set versions, newest first
  rules rollback VERSION   make an earlier version current again (a new version)
  rules import-envoy-ratelimit [--apply] [--partial] FILE
                           convert an envoyproxy/ratelimit configuration (YAML) into
                           a rule set: print it, or apply it; exit 1 naming the YAML
                           path of whatever cannot be converted
  usage KEY                a caller key's buckets and penalty
  reset KEY                delete a caller key's buckets and penalty
  top RULE [--by refused|consumed] [--n N]
                           the rule's keys with the most refusals or consumption
                           over the last minutes (hashed unless the service keeps raw keys)
  node-token [--sync-secret-file FILE] NODE
                           print gateway NODE's sync credential (its sync.secret and
                           sync.node), derived offline from the first master secret of
                           the service's sync secret file

Environment: TOLLGATE_SERVER, TOLLGATE_ADMIN_TOKEN (or TOLLGATE_ADMIN_TOKEN_FILE),
TOLLGATE_SYNC_SECRET_FILE (node-token),
TOLLGATE_ACTOR (who you are in the service's audit log; default $USER),
TOLLGATE_REASON (or --reason: why, kept with the rules version).
`

// errUsage is a wrong command line (exit 2).
var errUsage = errors.New("usage")

// run runs one command and returns the exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tollgate", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	server := fs.String("server", envOr(getenv, "TOLLGATE_SERVER", "http://127.0.0.1:8082"), "admin API base URL")
	tokenFile := fs.String("admin-token-file", getenv("TOLLGATE_ADMIN_TOKEN_FILE"), "file holding the admin token")
	timeout := fs.Duration("timeout", 10*time.Second, "bound on each request")
	reason := fs.String("reason", getenv("TOLLGATE_REASON"), "why a rule change is made (kept with the version)")
	if err := fs.Parse(args); err != nil || fs.NArg() == 0 {
		if err != nil && !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "tollgate:", err)
		}
		fmt.Fprint(stderr, usage)
		return 2
	}
	token := getenv("TOLLGATE_ADMIN_TOKEN")
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			fmt.Fprintln(stderr, "tollgate: admin token file:", err)
			return 2
		}
		token = strings.TrimSpace(string(b))
	}
	c := &client{base: strings.TrimRight(*server, "/"), token: token, timeout: *timeout,
		actor: envOr(getenv, "TOLLGATE_ACTOR", getenv("USER")), reason: *reason}
	cmd := &command{c: c, getenv: getenv, stdin: stdin, stdout: stdout, stderr: stderr}
	code, err := cmd.dispatch(ctx, fs.Args())
	switch {
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "tollgate: %v\n", err)
		fmt.Fprint(stderr, usage)
		return 2
	case err != nil:
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintln(stderr, "tollgate:", line)
		}
		return max(code, 1)
	}
	return code
}

func envOr(getenv func(string) string, name, def string) string {
	if v := getenv(name); v != "" {
		return v
	}
	return def
}

// newFlagSet returns a flag set for a subcommand's own flags (errors are reported by
// the caller, with the usage).
func newFlagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("tollgate", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tollgate-rl/tollgate/ratelimit/credential"
	"github.com/tollgate-rl/tollgate/ratelimit/rlsimport"
	"github.com/tollgate-rl/tollgate/ratelimit/validate"
)

// command holds what every subcommand needs.
type command struct {
	c              *client
	getenv         func(string) string
	stdin          io.Reader
	stdout, stderr io.Writer
}

// dispatch runs one subcommand; it returns the exit code for outcomes that are not
// failures (diff's 1) and an error for failures.
func (x *command) dispatch(ctx context.Context, args []string) (int, error) {
	want := func(n int, form string) error {
		if len(args) != n {
			return fmt.Errorf("%w: want %q", errUsage, "tollgate "+form)
		}
		return nil
	}
	switch args[0] {
	case "rules":
		if len(args) < 2 {
			return 0, fmt.Errorf("%w: rules needs a subcommand", errUsage)
		}
		switch args[1] {
		case "validate":
			if err := want(3, "rules validate FILE"); err != nil {
				return 0, err
			}
			return validate.File("tollgate", args[2], x.stdin, x.stdout, x.stderr), nil
		case "apply":
			if err := want(3, "rules apply FILE"); err != nil {
				return 0, err
			}
			return 0, x.apply(ctx, args[2])
		case "diff":
			if err := want(3, "rules diff FILE"); err != nil {
				return 0, err
			}
			return x.diff(ctx, args[2])
		case "history":
			if err := want(2, "rules history"); err != nil {
				return 0, err
			}
			return 0, x.history(ctx)
		case "import-envoy-ratelimit":
			return x.importEnvoy(ctx, args[2:])
		case "rollback":
			if err := want(3, "rules rollback VERSION"); err != nil {
				return 0, err
			}
			return 0, x.rollback(ctx, args[2])
		}
		return 0, fmt.Errorf("%w: unknown rules subcommand %q", errUsage, args[1])
	case "usage":
		if err := want(2, "usage KEY"); err != nil {
			return 0, err
		}
		var raw json.RawMessage
		if _, err := x.c.do(ctx, "GET", "/v1/usage/"+url.PathEscape(args[1]), "", nil, &raw); err != nil {
			return 0, err
		}
		return 0, x.printJSON(raw)
	case "reset":
		if err := want(2, "reset KEY"); err != nil {
			return 0, err
		}
		var out struct {
			Deleted int64 `json:"deleted"`
		}
		if _, err := x.c.do(ctx, "POST", "/v1/reset/"+url.PathEscape(args[1]), "", nil, &out); err != nil {
			return 0, err
		}
		fmt.Fprintf(x.stdout, "reset: %d Redis keys deleted\n", out.Deleted)
		return 0, nil
	case "top":
		return 0, x.top(ctx, args[1:])
	case "node-token":
		return 0, x.nodeToken(args[1:])
	}
	return 0, fmt.Errorf("%w: unknown command %q", errUsage, args[0])
}

// readRules reads a rule-set file as JSON, as `rules validate` does.
func readRules(name string, stdin io.Reader) ([]byte, error) {
	data, err := validate.Read(name, stdin)
	if err != nil {
		return nil, err
	}
	js, err := validate.JSON(name, data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return js, nil
}

func (x *command) apply(ctx context.Context, name string) error {
	js, err := readRules(name, x.stdin)
	if err != nil {
		return err
	}
	var out struct {
		Version uint64 `json:"version"`
	}
	if _, err := x.c.do(ctx, "PUT", "/v1/rules", "application/json", js, &out); err != nil {
		return err
	}
	fmt.Fprintf(x.stdout, "applied %s: rules version %d\n", name, out.Version)
	return nil
}

const importForm = "rules import-envoy-ratelimit [--apply] [--partial] FILE"

// importEnvoy converts an envoyproxy/ratelimit configuration (rlsimport) and prints the
// rule set, or applies it with --apply. Whatever cannot be converted is named by its YAML
// path and fails the command (exit 1) with nothing printed or applied, unless --partial
// asks for the rest anyway (still exit 1: the rules decide differently there).
func (x *command) importEnvoy(ctx context.Context, args []string) (int, error) {
	fs := newFlagSet()
	apply := fs.Bool("apply", false, "make the converted rules the service's rule set")
	partial := fs.Bool("partial", false, "print or apply what converted even when something did not")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		return 0, fmt.Errorf("%w: want %q", errUsage, "tollgate "+importForm)
	}
	name := fs.Arg(0)
	data, err := validate.Read(name, x.stdin)
	if err != nil {
		return 0, err
	}
	res := rlsimport.Convert(data)
	for _, n := range res.Notes {
		fmt.Fprintf(x.stderr, "tollgate: %s: %s: note: %s\n", name, n.Where(), n.Msg)
	}
	for _, p := range res.Problems {
		fmt.Fprintf(x.stderr, "tollgate: %s: %s: cannot convert: %s\n", name, p.Where(), p.Msg)
	}
	code := 0
	if len(res.Problems) > 0 {
		code = 1
		if !*partial || res.Rules == nil {
			return 0, fmt.Errorf("%s: %d part(s) cannot be converted; nothing %s (--partial %s the rest)",
				name, len(res.Problems), map[bool]string{true: "applied", false: "printed"}[*apply], map[bool]string{true: "applies", false: "prints"}[*apply])
		}
	}
	if !*apply {
		_, err := x.stdout.Write(res.Rules)
		return code, err
	}
	var out struct {
		Version uint64 `json:"version"`
	}
	if _, err := x.c.do(ctx, "PUT", "/v1/rules", "application/json", res.Rules, &out); err != nil {
		return 0, err
	}
	fmt.Fprintf(x.stdout, "applied %s (converted): rules version %d\n", name, out.Version)
	return code, nil
}

func (x *command) rollback(ctx context.Context, arg string) error {
	v, err := strconv.ParseUint(arg, 10, 64)
	if err != nil || v == 0 {
		return fmt.Errorf("%w: VERSION %q is not a positive integer", errUsage, arg)
	}
	var out struct {
		Version, From uint64
	}
	if _, err := x.c.do(ctx, "POST", "/v1/rules/rollback/"+strconv.FormatUint(v, 10), "", nil, &out); err != nil {
		return err
	}
	fmt.Fprintf(x.stdout, "rolled back to version %d's rules: rules version %d\n", out.From, out.Version)
	return nil
}

func (x *command) history(ctx context.Context) error {
	var out struct {
		Current  uint64 `json:"current"`
		Versions []struct {
			Version uint64    `json:"version"`
			At      time.Time `json:"at"`
			By      string    `json:"by"`
			Action  string    `json:"action"`
			From    uint64    `json:"from"`
			Size    int       `json:"size"`
			Reason  string    `json:"reason"`
		} `json:"versions"`
	}
	if _, err := x.c.do(ctx, "GET", "/v1/rules/versions", "", nil, &out); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(x.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tAT\tBY\tACTION\tBYTES\tREASON\t")
	for _, r := range out.Versions {
		action := r.Action
		if r.From != 0 {
			action += " from " + strconv.FormatUint(r.From, 10)
		}
		mark := ""
		if r.Version == out.Current {
			mark = "(current)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", r.Version, r.At.UTC().Format(time.RFC3339), r.By, action, r.Size, strconv.Quote(r.Reason), mark)
	}
	return tw.Flush()
}

func (x *command) top(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: want %q", errUsage, "tollgate top RULE [--by refused|consumed] [--n N]")
	}
	rule := args[0]
	fs := newFlagSet()
	by := fs.String("by", "refused", "refused or consumed")
	n := fs.Int("n", 10, "keys to list")
	if err := fs.Parse(args[1:]); err != nil || fs.NArg() > 0 {
		return fmt.Errorf("%w: want %q", errUsage, "tollgate top RULE [--by refused|consumed] [--n N]")
	}
	if *by != "refused" && *by != "consumed" {
		return fmt.Errorf("%w: --by %q: want refused or consumed", errUsage, *by)
	}
	q := url.Values{"rule": {rule}, "by": {*by}, "n": {strconv.Itoa(*n)}}
	var out struct {
		Minutes int  `json:"minutes"`
		Hashed  bool `json:"hashed"`
		Keys    []struct {
			Key   string `json:"key"`
			Count uint64 `json:"count"`
		} `json:"keys"`
	}
	if _, err := x.c.do(ctx, "GET", "/v1/top?"+q.Encode(), "", nil, &out); err != nil {
		return err
	}
	what := "key"
	if out.Hashed {
		what = "key hash"
	}
	fmt.Fprintf(x.stdout, "rule %s, by %s, last %d minutes (%s):\n", rule, *by, out.Minutes, what)
	tw := tabwriter.NewWriter(x.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "RANK\t%s\tKEY\n", map[string]string{"refused": "REFUSED", "consumed": "CONSUMED"}[*by])
	for i, k := range out.Keys {
		fmt.Fprintf(tw, "%d\t%d\t%s\n", i+1, k.Count, k.Key)
	}
	if len(out.Keys) == 0 {
		fmt.Fprintln(tw, "-\t-\t(none yet: instances add their counts every few seconds)")
	}
	return tw.Flush()
}

// printJSON prints an answer indented.
func (x *command) printJSON(raw []byte) error {
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return err
	}
	b.WriteByte('\n')
	_, err := x.stdout.Write(b.Bytes())
	return err
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// nodeToken prints a gateway's sync credential: the node token of NODE under the first
// master secret of --sync-secret-file (or TOLLGATE_SYNC_SECRET_FILE), the file the
// service reads. It works offline: the service derives the same token from the same
// master, so nothing is registered anywhere.
func (x *command) nodeToken(args []string) error {
	fs := newFlagSet()
	file := fs.String("sync-secret-file", x.getenv("TOLLGATE_SYNC_SECRET_FILE"), "the service's sync secret file")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		return fmt.Errorf("%w: want %q", errUsage, "tollgate node-token [--sync-secret-file FILE] NODE")
	}
	if *file == "" {
		return fmt.Errorf("%w: node-token needs --sync-secret-file (or TOLLGATE_SYNC_SECRET_FILE)", errUsage)
	}
	raw, err := os.ReadFile(*file)
	if err != nil {
		return fmt.Errorf("sync secret file: %w", err)
	}
	master := ""
	for _, line := range strings.Split(string(raw), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			master = line
			break
		}
	}
	if master == "" {
		return fmt.Errorf("sync secret file %s: no secret in it", *file)
	}
	tok, err := credential.Issue([]byte(master), fs.Arg(0))
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(x.stdout, tok)
	return err
}

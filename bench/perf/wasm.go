package perf

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
)

// Module packages measured for the decision cost: a pass-through filter, the
// floor of one single-rule decision (its unavoidable host calls and no logic) and the
// Tollgate filter.
const (
	EmptyPkg  = "./filter/bench/empty"
	FloorPkg  = "./filter/bench/floor"
	FilterPkg = "./filter"
)

// BuildModule builds pkg (relative to the repository root) with the shipping recipe
// (wasmbuild.Build, the recipe of `make wasm` and filter/wasmtest.BuildWasm) and returns
// the module.
func BuildModule(pkg string) ([]byte, error) { return wasmbuild.Build(pkg) }

// FirstVersion is the revision whose filter the decision cost is compared with: the
// first version that worked end to end, before its request path lost its allocations,
// maps and extra clock reads. Its modules are built as it shipped them (the Go
// toolchain's output as it comes, no shim, no optimizer).
const FirstVersion = "c8e7beb"

// BuildAtRevision builds pkgs (relative to the repository root) as they were at rev:
// `git archive` of the revision into a temporary directory, then the Go toolchain's
// wasip1 c-shared build there. It needs the repository's history (a clone, not an
// export of one revision); the error says what was missing.
func BuildAtRevision(rev string, pkgs ...string) (map[string][]byte, error) {
	return buildAtRevision(rev, false, pkgs...)
}

// buildAtRevision is BuildAtRevision; with profile, the filter is compiled with today's
// filter/default.pgo, as `make wasm` would compile that revision's source today.
func buildAtRevision(rev string, profile bool, pkgs ...string) (map[string][]byte, error) {
	root, err := wasmbuild.RepoRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tollgate-rev-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	archive := exec.Command("git", "-C", root, "archive", "--format=tar", rev)
	untar := exec.Command("tar", "-x", "-C", dir)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return nil, err
	}
	untar.Stdin = pipe
	var gitErr bytes.Buffer
	archive.Stderr = &gitErr
	if err := untar.Start(); err != nil {
		return nil, fmt.Errorf("tar: %w", err)
	}
	if err := archive.Run(); err != nil {
		untar.Wait()
		return nil, fmt.Errorf("git archive %s: %w: %s", rev, err, bytes.TrimSpace(gitErr.Bytes()))
	}
	if err := untar.Wait(); err != nil {
		return nil, fmt.Errorf("tar of git archive %s: %w", rev, err)
	}
	if profile {
		pgo, err := os.ReadFile(filepath.Join(root, "filter", "default.pgo"))
		if err != nil {
			return nil, fmt.Errorf("the filter's profile: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "filter", "default.pgo"), pgo, 0o644); err != nil {
			return nil, err
		}
	}
	out := map[string][]byte{}
	for _, pkg := range pkgs {
		file := filepath.Join(dir, "module.wasm")
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-buildvcs=false", "-trimpath", "-o", file, pkg)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
		if msg, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build %s at %s: %w\n%s", pkg, rev, err, msg)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		out[pkg] = b
	}
	return out, nil
}

// ShippedAtRevision is BuildAtRevision with the shipping recipe (today's profile for the
// filter, the WASI shim linked in, the jumps threaded, the optimizer run): a revision's
// module as `make wasm` makes it today, to compare with the current one step for step.
func ShippedAtRevision(rev string, pkgs ...string) (map[string][]byte, error) {
	mods, err := buildAtRevision(rev, true, pkgs...)
	if err != nil {
		return nil, err
	}
	for pkg, m := range mods {
		linked, err := wasmbuild.Link(m)
		if err != nil {
			return nil, fmt.Errorf("%s at %s: linking the WASI shim: %w", pkg, rev, err)
		}
		threaded, _, err := wasmbuild.Thread(linked)
		if err != nil {
			return nil, fmt.Errorf("%s at %s: threading the jumps: %w", pkg, rev, err)
		}
		if mods[pkg], err = wasmbuild.Optimize(threaded); err != nil {
			return nil, fmt.Errorf("%s at %s: optimizing: %w", pkg, rev, err)
		}
	}
	return mods, nil
}

// Package wasmbuild builds the proxy-wasm modules Tollgate ships and tests: the standard
// Go toolchain's wasip1 reactor (GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared),
// then Link, which resolves inside the module the WASI functions Go's runtime imports
// beyond what Envoy's proxy-wasm host has offered for years (shim.wat says which and
// how each is answered). The result imports only WASI functions every Envoy with a Wasm
// runtime offers, never hands poll_oneoff to the host (Envoy 1.33–1.38 answered it with
// an error that aborts Go's runtime, golang/go#78513), and makes no WASI call during
// _initialize outside Envoy's start-up allow-list. Thread then turns the forward jumps
// of Go's resumable functions into direct branches (thread.go says why), Optimize runs
// binaryen's wasm-opt over it for size, and MeasureSizes says where the bytes go.
//
// A step stays only where it pays in Envoy (BENCHMARKS.md §12 measures each in Envoy's
// V8): Thread cuts the CPU V8 spends compiling the module at every start by about a
// quarter, and some per-request CPU. A step that shipped the data section compressed and
// dropped the runtime's file and line tables saved neither CPU nor start-up there (V8's
// start-up is compiling the code) and was removed, so a panic's traceback names file and
// line.
//
// `make wasm`, the filter tests (filter/wasmtest), the end-to-end harness and the
// benchmarks all build through Build, so every test runs the module that ships.
//
// WASI preview 1: https://github.com/WebAssembly/WASI/blob/main/legacy/preview1/docs.md
package wasmbuild

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// Build compiles pkg (an import path, or a path relative to the repository root such as
// "./filter") for wasip1 as a reactor with the given build tags, links the shim into it,
// threads its jumps (Thread), runs the optimizer over it (Optimize) and returns the
// module. The Go toolchain applies the main package's default.pgo
// (filter/default.pgo, `make pgo`).
func Build(pkg string, tags ...string) ([]byte, error) { return Recipe{}.Build(pkg, tags...) }

// Recipe leaves steps out of Build, to measure what each gives; the zero value is Build.
type Recipe struct {
	NoProfile bool // compile without the package's default.pgo (-pgo=off)
	NoThread  bool // skip Thread
	// Names keeps a name section (the Go functions' names) through every step, for
	// profilers: wazero built with the perfmap tag then names each guest frame in
	// perf's map. The optimizer, keeping names, gives nearly but not exactly the shipped
	// code, so a profile of this module is a guide, not the shipped module's.
	Names bool
}

// Build is Build without the steps the recipe leaves out.
func (rc Recipe) Build(pkg string, tags ...string) ([]byte, error) {
	st, err := rc.stages(pkg, tags...)
	if err != nil {
		return nil, err
	}
	return st.Optimized, nil
}

// Stages is one build's module after each step of Build.
type Stages struct {
	Toolchain []byte // GoBuild
	Linked    []byte // Link: the WASI shim resolved inside
	Threaded  []byte // Thread: jumps taken directly (Linked, if the recipe leaves it out)
	Optimized []byte // Optimize: what Build returns
}

// BuildStages is Build, keeping the module of every step (the size report measures the
// linked one: the optimizer's output no longer says which function is which).
func BuildStages(pkg string, tags ...string) (*Stages, error) { return Recipe{}.stages(pkg, tags...) }

func (rc Recipe) stages(pkg string, tags ...string) (*Stages, error) {
	var st Stages
	var err error
	if st.Toolchain, err = goBuild(pkg, rc, tags...); err != nil {
		return nil, err
	}
	if st.Linked, err = Link(st.Toolchain); err != nil {
		return nil, fmt.Errorf("linking the WASI shim into %q: %w", pkg, err)
	}
	st.Threaded = st.Linked
	if !rc.NoThread {
		if st.Threaded, _, err = Thread(st.Linked); err != nil {
			return nil, fmt.Errorf("threading the jumps of %q: %w", pkg, err)
		}
	}
	opt := OptimizerArgs
	if rc.Names {
		opt = append(slices.Clip(opt), "-g") // keep the name section
	}
	if st.Optimized, err = optimize(st.Threaded, opt); err != nil {
		return nil, fmt.Errorf("optimizing %q: %w", pkg, err)
	}
	return &st, nil
}

// GoBuild is Build without Link: the Go toolchain's module as it comes. Tests use it to
// show what the shim prevents.
func GoBuild(pkg string, tags ...string) ([]byte, error) { return goBuild(pkg, Recipe{}, tags...) }

// goBuild is GoBuild, with or without the main package's default.pgo and the name
// section, as the recipe says.
func goBuild(pkg string, rc Recipe, tags ...string) ([]byte, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tollgate-wasm-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "module.wasm")
	// -s, unless the recipe keeps names: no name section (the runtime's tracebacks read
	// the pclntab, not the name section, and the optimizer would drop it anyway).
	args := []string{"build", "-buildmode=c-shared", "-buildvcs=false", "-trimpath"}
	if !rc.Names {
		args = append(args, "-ldflags=-s")
	}
	if rc.NoProfile {
		args = append(args, "-pgo=off")
	}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	cmd := exec.Command("go", append(args, "-o", out, pkg)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build %q: %w\n%s", pkg, err, msg)
	}
	wasm, err := os.ReadFile(out)
	if err != nil {
		return nil, fmt.Errorf("reading the module built from %q: %w", pkg, err)
	}
	return wasm, nil
}

// RepoRoot returns the directory of the go.mod of the module being built (the go
// command's view from the working directory).
func RepoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("go env GOMOD: not inside a module")
	}
	return filepath.Dir(mod), nil
}

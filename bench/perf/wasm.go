package perf

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Module packages measured for the decision cost (issue 3): a pass-through filter, the
// floor of one single-rule decision (its unavoidable host calls and no logic) and the
// Tollgate filter.
const (
	EmptyPkg  = "./filter/bench/empty"
	FloorPkg  = "./filter/bench/floor"
	FilterPkg = "./filter"
)

// RepoRoot returns the directory holding the module's go.mod.
func RepoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("go env GOMOD: not inside a module")
	}
	return filepath.Dir(mod), nil
}

// BuildModule builds pkg (relative to the repository root) with the shipping recipe
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -trimpath
//
// (the recipe of `make wasm` and filter/wasmtest.BuildWasm) and returns the module.
func BuildModule(pkg string) ([]byte, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tollgate-bench-wasm-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "module.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-buildvcs=false", "-trimpath", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build %q: %w\n%s", pkg, err, msg)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return nil, fmt.Errorf("read module built from %q: %w", pkg, err)
	}
	return b, nil
}

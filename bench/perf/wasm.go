package perf

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
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
// (wasmbuild.Build, the recipe of `make wasm` and filter/wasmtest.BuildWasm) and returns
// the module.
func BuildModule(pkg string) ([]byte, error) { return wasmbuild.Build(pkg) }

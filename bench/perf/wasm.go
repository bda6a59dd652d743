package perf

import (
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

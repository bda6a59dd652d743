//go:build !wasip1

package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
	"github.com/tollgate-rl/tollgate/filter/wasmtest"
)

// What the filter links, checked on the shipped module (the package of every function
// comes from the module's own pclntab) and on its import graph.
//
// encoding/json never: tidwall/pretty, which gjson imports, is replaced by a fork
// without it (third_party/pretty). fmt, and with it os and most of reflect, only while
// shared/rule imports fmt for its error messages; once no package of the filter imports
// fmt, the module must link no function of fmt or os, almost none of reflect (which
// encoding/binary imports), and must be smaller.
const (
	// maxModuleBytes bounds the shipped module; maxModuleBytesFmt while fmt is linked.
	// Where the bytes go: go run ./filter/wasmbuild/cmd/tollgate-wasm -sizes ./filter
	maxModuleBytes    = 3_850_000
	maxModuleBytesFmt = 4_300_000
	// maxReflectFuncs bounds reflect's linked functions without fmt (the runtime keeps
	// one).
	maxReflectFuncs = 2
)

// fmtImporters are the packages in the filter's import graph allowed to import fmt.
var fmtImporters = []string{"github.com/tollgate-rl/tollgate/shared/rule"}

func TestModuleLinks(t *testing.T) {
	graph := importGraph(t, "./filter")
	importers := func(pkg string) []string {
		var by []string
		for p, imps := range graph {
			if slices.Contains(imps, pkg) {
				by = append(by, p)
			}
		}
		slices.Sort(by)
		return by
	}
	if _, ok := graph["encoding/json"]; ok {
		t.Errorf("encoding/json is in the filter's import graph, imported by %v", importers("encoding/json"))
	}
	withFmt := false
	if _, ok := graph["fmt"]; ok {
		withFmt = true
		for _, p := range importers("fmt") {
			if !slices.Contains(fmtImporters, p) {
				t.Errorf("%s imports fmt (allowed only in %v)", p, fmtImporters)
			}
		}
	}
	if by := importers("os"); len(by) > 0 && !slices.Equal(by, []string{"fmt"}) {
		t.Errorf("os imported by %v (at most by fmt)", by)
	}

	wasm := wasmtest.FilterWasm(t)
	s, err := wasmbuild.MeasureSizes(wasm)
	if err != nil {
		t.Fatal(err)
	}
	linked := map[string]wasmbuild.PackageSize{}
	for _, p := range s.Packages {
		linked[p.Package] = p
	}
	t.Logf("module %d bytes; fmt in the graph: %v; functions linked: fmt %d, os %d, reflect %d",
		len(wasm), withFmt, linked["fmt"].Funcs, linked["os"].Funcs, linked["reflect"].Funcs)
	if p, ok := linked["encoding/json"]; ok {
		t.Errorf("the module links %d functions of encoding/json", p.Funcs)
	}
	limit := maxModuleBytesFmt
	if !withFmt {
		limit = maxModuleBytes
		for _, pkg := range []string{"fmt", "os"} {
			if p, ok := linked[pkg]; ok {
				t.Errorf("no package imports fmt, yet the module links %d functions of %s", p.Funcs, pkg)
			}
		}
		if p := linked["reflect"]; p.Funcs > maxReflectFuncs {
			t.Errorf("reflect: %d functions linked, want at most %d", p.Funcs, maxReflectFuncs)
		}
	}
	if len(wasm) > limit {
		t.Errorf("the module is %d bytes, want at most %d", len(wasm), limit)
	}
}

// importGraph maps each package pkg depends on for wasip1 to its imports.
func importGraph(t *testing.T, pkg string) map[string][]string {
	t.Helper()
	root, err := wasmbuild.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	g := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		g[f[0]] = f[1:]
	}
	return g
}

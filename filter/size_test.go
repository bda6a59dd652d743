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

// What the filter links, checked on its import graph and on the shipped module (the
// package of every function comes from the module's own function table): no
// encoding/json (tidwall/pretty, which gjson imports, is replaced by a fork without it:
// third_party/pretty), no fmt and so no os, almost none of reflect (encoding/binary
// imports it). The module's size is not bounded here: what a user feels of it is the
// start-up of every VM and the memory each takes in Envoy, and the compressed image
// pulled, which BENCHMARKS.md §12 measures in Envoy; `go run
// ./filter/wasmbuild/cmd/tollgate-wasm -sizes ./filter` says where the bytes go.
const (
	// maxReflectFuncs bounds reflect's linked functions (the runtime keeps one).
	maxReflectFuncs = 2
)

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
	for _, pkg := range []string{"encoding/json", "fmt", "os"} {
		if _, ok := graph[pkg]; ok {
			t.Errorf("%s is in the filter's import graph, imported by %v", pkg, importers(pkg))
		}
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
	t.Logf("module %d bytes; functions linked: reflect %d", len(wasm), linked["reflect"].Funcs)
	for _, pkg := range []string{"encoding/json", "fmt", "os"} {
		if p, ok := linked[pkg]; ok {
			t.Errorf("the module links %d functions of %s", p.Funcs, pkg)
		}
	}
	if p := linked["reflect"]; p.Funcs > maxReflectFuncs {
		t.Errorf("reflect: %d functions linked, want at most %d", p.Funcs, maxReflectFuncs)
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

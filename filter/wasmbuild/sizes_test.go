package wasmbuild

import (
	"strings"
	"testing"
)

// The size report on the filter as linked: every byte of the code section is some
// package's, the pclntab's names sit at the right function indices (each proxy_on_*
// export is the function the pclntab names so), and only the shim's functions are
// missing from the pclntab.
func TestMeasureSizes(t *testing.T) {
	raw, err := GoBuild("./filter")
	if err != nil {
		t.Fatal(err)
	}
	wasm, err := Link(raw)
	if err != nil {
		t.Fatal(err)
	}
	s, err := MeasureSizes(wasm)
	if err != nil {
		t.Fatal(err)
	}
	secs, err := splitSections(wasm)
	if err != nil {
		t.Fatal(err)
	}
	var bodies [][]byte
	var exports [][]byte
	nImports := 0
	for _, sec := range secs {
		switch sec.id {
		case secCode:
			bodies, err = readVec(sec.body, readSized)
		case secExport:
			exports, err = readVec(sec.body, readExport)
		case secImport:
			var imps [][]byte
			imps, err = readVec(sec.body, readImport)
			for _, raw := range imps {
				if parseImport(raw).kind == 0 {
					nImports++
				}
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	code, funcs := 0, 0
	byPkg := map[string]PackageSize{}
	for _, p := range s.Packages {
		code += p.Code
		funcs += p.Funcs
		byPkg[p.Package] = p
	}
	want := 0
	for _, b := range bodies {
		want += len(b) // a body and its size
	}
	if code != want || funcs != len(bodies) {
		t.Errorf("packages hold %d bytes of code in %d functions; the code section %d in %d", code, funcs, want, len(bodies))
	}
	if p := byPkg["(not in pclntab)"]; p.Funcs != len(Shimmed()) {
		t.Errorf("%d functions not in the pclntab, want the shim's %d", p.Funcs, len(Shimmed()))
	}
	for _, pkg := range []string{"runtime", "main", "github.com/tidwall/gjson", "github.com/tollgate-rl/tollgate/filter/plugin"} {
		if p := byPkg[pkg]; p.Code == 0 || p.Pclntab == 0 {
			t.Errorf("%s: %+v", pkg, p)
		}
	}
	if s.Data.Pclntab == 0 || s.Data.Pclntab+s.Data.Other+s.Data.Overhead+1 > s.Data.Bytes {
		t.Errorf("data split %+v", s.Data)
	}
	index := map[string]int{}
	for _, f := range s.Funcs {
		index[f.Name] = f.Index
	}
	checked := 0
	for _, e := range exports {
		r := reader{b: e}
		name, kind, idx := r.name(), r.byte(), int(r.u32())
		if kind != 0 || !strings.HasPrefix(name, "proxy_on_") {
			continue
		}
		checked++
		if got, ok := index[name]; !ok || got != idx-nImports {
			t.Errorf("export %s is function %d; the report has it at %d (listed %v)", name, idx-nImports, got, ok)
		}
	}
	if checked < 10 {
		t.Errorf("only %d proxy_on_* exports checked", checked)
	}
}

func TestMeasureSizesRefuses(t *testing.T) {
	for name, wasm := range map[string][]byte{
		"not wasm":     []byte("hello"),
		"no pclntab":   {0, 'a', 's', 'm', 1, 0, 0, 0},
		"bad data":     {0, 'a', 's', 'm', 1, 0, 0, 0, 11, 3, 1, 7, 0},
		"segment huge": {0, 'a', 's', 'm', 1, 0, 0, 0, 11, 9, 1, 0, 0x41, 0xFF, 0xFF, 0xFF, 0xFF, 0x07, 0x0B, 0},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := MeasureSizes(wasm); err == nil {
				t.Error("accepted")
			}
		})
	}
}

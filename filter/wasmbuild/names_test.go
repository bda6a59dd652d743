package wasmbuild

import (
	"maps"
	"slices"
	"testing"
)

// A module built with Recipe.Names names its functions correctly after every step (the
// shim's renumbering, Thread and the optimizer): each Go export's function carries
// the export's name. The shipped recipe keeps no name section.
func TestNamesSurviveTheBuild(t *testing.T) {
	const pkg = "./filter/bench/floor"
	named, err := Recipe{Names: true}.Build(pkg)
	if err != nil {
		t.Fatal(err)
	}
	names, exports, err := funcNames(named)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) < 1000 {
		t.Fatalf("%d functions named, want the whole runtime's", len(names))
	}
	for _, export := range []string{"proxy_on_request_headers", "proxy_on_response_headers", "proxy_on_context_create", "proxy_on_memory_allocate"} {
		idx, ok := exports[export]
		if !ok {
			t.Fatalf("no export %q", export)
		}
		if names[idx] != export {
			t.Errorf("export %q is function %d, named %q", export, idx, names[idx])
		}
	}
	if !slices.Contains(slices.Collect(maps.Values(names)), "runtime.memmove") {
		t.Error("no function named runtime.memmove")
	}

	shipped, err := Build(pkg)
	if err != nil {
		t.Fatal(err)
	}
	if names, _, err := funcNames(shipped); err != nil || len(names) != 0 {
		t.Fatalf("the shipped recipe names %d functions (err %v), want none", len(names), err)
	}
}

// funcNames reads a module's function names (the name section's subsection 1) and its
// function exports, with the package's own section reader.
func funcNames(wasm []byte) (names map[uint32]string, exports map[string]uint32, err error) {
	names, exports = map[uint32]string{}, map[string]uint32{}
	secs, err := splitSections(wasm)
	if err != nil {
		return nil, nil, err
	}
	for _, s := range secs {
		switch s.id {
		case secExport:
			exps, err := readVec(s.body, readExport)
			if err != nil {
				return nil, nil, err
			}
			for _, e := range exps {
				r := reader{b: e}
				if name, kind, idx := r.name(), r.byte(), r.u32(); kind == 0 {
					exports[name] = idx
				}
			}
		case secCustom:
			r := reader{b: s.body}
			if r.name() != "name" {
				continue
			}
			for !r.done() {
				id, sub := r.byte(), r.bytes(int(r.u32()))
				if id != 1 {
					continue
				}
				sr := reader{b: sub}
				for n := sr.u32(); n > 0 && sr.err == nil; n-- {
					idx := sr.u32()
					names[idx] = sr.name()
				}
				if sr.err != nil {
					return nil, nil, sr.err
				}
			}
			if r.err != nil {
				return nil, nil, r.err
			}
		}
	}
	return names, exports, nil
}

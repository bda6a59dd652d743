package wasmbuild_test

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
)

// A module built with Recipe.Names names its functions correctly after every step (the
// shim's renumbering, Thread, the optimizer and Pack): each Go export's function carries
// the export's name. The shipped recipe keeps no name section.
func TestNamesSurviveTheBuild(t *testing.T) {
	const pkg = "./filter/bench/floor"
	named, err := wasmbuild.Recipe{Names: true}.Build(pkg)
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
	if !hasName(names, "runtime.memmove") {
		t.Error("no function named runtime.memmove")
	}

	shipped, err := wasmbuild.Build(pkg)
	if err != nil {
		t.Fatal(err)
	}
	if names, _, err := funcNames(shipped); err != nil || len(names) != 0 {
		t.Fatalf("the shipped recipe names %d functions (err %v), want none", len(names), err)
	}
}

func hasName(names map[uint32]string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}

// funcNames reads a module's function names (the name section's subsection 1) and its
// function exports.
func funcNames(wasm []byte) (names map[uint32]string, exports map[string]uint32, err error) {
	names, exports = map[uint32]string{}, map[string]uint32{}
	if len(wasm) < 8 {
		return nil, nil, errors.New("short module")
	}
	b := wasm[8:]
	u32 := func() uint32 {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			err = errors.New("bad LEB128")
			b = nil
			return 0
		}
		b = b[n:]
		return uint32(v)
	}
	str := func() string {
		n := int(u32())
		if n > len(b) {
			err = errors.New("name past the end")
			b = nil
			return ""
		}
		s := string(b[:n])
		b = b[n:]
		return s
	}
	for len(b) > 0 && err == nil {
		id := b[0]
		b = b[1:]
		size := int(u32())
		if size > len(b) {
			return nil, nil, errors.New("section past the end")
		}
		body, rest := b[:size], b[size:]
		b = body
		switch id {
		case 7: // exports
			for n := u32(); n > 0 && err == nil; n-- {
				name := str()
				kind := b[0]
				b = b[1:]
				if idx := u32(); kind == 0 {
					exports[name] = idx
				}
			}
		case 0:
			if str() != "name" {
				break
			}
			for len(b) > 0 && err == nil {
				sub := b[0]
				b = b[1:]
				n := int(u32())
				subBody, after := b[:n], b[n:]
				if sub == 1 {
					b = subBody
					for cnt := u32(); cnt > 0 && err == nil; cnt-- {
						idx := u32()
						names[idx] = str()
					}
				}
				b = after
			}
		}
		b = rest
	}
	return names, exports, err
}

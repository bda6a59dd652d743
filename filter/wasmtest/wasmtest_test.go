package wasmtest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// A hand-assembled module keeps these tests independent of the Go toolchain's output.

func section(id byte, content []byte) []byte {
	return append(appendU32([]byte{id}, uint32(len(content))), content...)
}

func vec(items ...[]byte) []byte {
	out := appendU32(nil, uint32(len(items)))
	for _, it := range items {
		out = append(out, it...)
	}
	return out
}

func name(s string) []byte { return append(appendU32(nil, uint32(len(s))), s...) }

func cat(parts ...[]byte) []byte { return slices.Concat(parts...) }

const (
	fnKind  = 0x00
	memKind = 0x02
	vI32    = 0x7f
	vI64    = 0x7e
)

func functype(params, results []byte) []byte {
	return cat([]byte{0x60}, vec(split(params)...), vec(split(results)...))
}

func split(b []byte) [][]byte {
	out := make([][]byte, len(b))
	for i := range b {
		out[i] = b[i : i+1]
	}
	return out
}

// testModule imports wasi random_get and env.proxy_log, exports memory, an _initialize
// that calls both, and proxy_on_tick with a wrong i64 parameter. exports, when not nil,
// replaces the export section's entries.
func testModule(exports [][]byte) []byte {
	types := section(1, vec(
		functype(nil, nil),                               // 0: () -> ()
		functype([]byte{vI32, vI32}, []byte{vI32}),       // 1: random_get
		functype([]byte{vI32, vI32, vI32}, []byte{vI32}), // 2: proxy_log
		functype([]byte{vI64}, nil),                      // 3: (i64) -> ()
	))
	imports := section(2, vec(
		cat(name("wasi_snapshot_preview1"), name("random_get"), []byte{fnKind, 1}),
		cat(name("env"), name("proxy_log"), []byte{fnKind, 2}),
	))
	funcs := section(3, vec([]byte{0}, []byte{3})) // functions 2 and 3
	memory := section(5, vec([]byte{0x00, 1}))
	if exports == nil {
		exports = [][]byte{
			cat(name("memory"), []byte{memKind, 0}),
			cat(name("_initialize"), []byte{fnKind, 2}),
			cat(name("proxy_on_tick"), []byte{fnKind, 3}),
		}
	}
	initBody := []byte{
		0x00,             // no locals
		0x41, 0, 0x41, 4, // i32.const 0, i32.const 4
		0x10, 0, 0x1a, // call random_get, drop
		0x41, 2, 0x41, 0, 0x41, 0, // i32.const 2, 0, 0
		0x10, 1, 0x1a, // call proxy_log, drop
		0x0b,
	}
	tickBody := []byte{0x00, 0x0b}
	code := section(10, vec(
		append(appendU32(nil, uint32(len(initBody))), initBody...),
		append(appendU32(nil, uint32(len(tickBody))), tickBody...),
	))
	return cat([]byte("\x00asm\x01\x00\x00\x00"), types, imports, funcs, memory, section(7, vec(exports...)), code)
}

func TestListABI(t *testing.T) {
	imports, exports, err := ListABI(testModule(nil))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range append(imports, exports...) {
		got = append(got, f.String())
	}
	want := []string{
		"env.proxy_log(i32,i32,i32)->i32",
		"wasi_snapshot_preview1.random_get(i32,i32)->i32",
		"_initialize()->()",
		"proxy_on_tick(i64)->()",
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestStartupWASICalls(t *testing.T) {
	calls, err := StartupWASICalls(testModule(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"random_get", "env.proxy_log"}
	if !slices.Equal(calls, want) {
		t.Errorf("got %q, want %q", calls, want)
	}
}

// recordingTB collects what a Check function reports instead of failing the test.
type recordingTB struct {
	testing.TB
	errs []string
}

func (r *recordingTB) Helper() {}
func (r *recordingTB) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recordingTB) Fatalf(format string, args ...any) { r.Errorf(format, args...) }

func TestChecksReportViolations(t *testing.T) {
	wasm := testModule(nil)
	for _, tc := range []struct {
		name  string
		check func(testing.TB, []byte)
		want  []string // substrings, one reported error each
	}{
		{"CheckABI", CheckABI, []string{
			"proxy_on_tick(i64)->(): parameter 0 is i64",
			"export proxy_on_tick(i64)->(), want proxy_on_tick(i32)->()",
			"missing export proxy_on_request_headers(i32,i32,i32)->i32",
		}},
		{"CheckStartup", CheckStartup, []string{"_initialize calls [env.proxy_log] outside the allowed set"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recordingTB{TB: t}
			tc.check(rec, wasm)
			for _, w := range tc.want {
				if !slices.ContainsFunc(rec.errs, func(e string) bool { return strings.Contains(e, w) }) {
					t.Errorf("no report containing %q in %q", w, rec.errs)
				}
			}
		})
	}
}

func TestBuildWasmFailsTheTest(t *testing.T) {
	rec := &recordingTB{TB: t}
	if wasm := BuildWasm(rec, "./filter/no-such-package"); wasm != nil {
		t.Errorf("got %d bytes for a package that does not exist", len(wasm))
	}
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "no-such-package") {
		t.Errorf("want one fatal naming the package, got %q", rec.errs)
	}
}

func TestWithStartAlias(t *testing.T) {
	aliased, err := WithStartAlias(testModule(nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer r.Close(ctx)
	cm, err := r.CompileModule(ctx, aliased)
	if err != nil {
		t.Fatalf("aliased module does not compile: %v", err)
	}
	ex := cm.ExportedFunctions()
	start, init := ex["_start"], ex["_initialize"]
	if start == nil || init == nil {
		t.Fatalf("exports %v lack _start or _initialize", keys(ex))
	}
	if start.Index() != init.Index() {
		t.Errorf("_start is function %d, _initialize is %d", start.Index(), init.Index())
	}
	if len(ex) != 3 {
		t.Errorf("exports %v, want the original two functions plus _start", keys(ex))
	}
}

func keys(m map[string]api.FunctionDefinition) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestWithStartAliasErrors(t *testing.T) {
	good := testModule(nil)
	noExports := cat(good[:8], section(1, vec(functype(nil, nil))))
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"not wasm", []byte("\x7fELF...."), "not a wasm binary"},
		{"no export section", noExports, "no export section"},
		{"no _initialize", testModule([][]byte{cat(name("main"), []byte{fnKind, 2})}), "does not export _initialize"},
		{"_initialize is not a function", testModule([][]byte{cat(name("_initialize"), []byte{memKind, 0})}), "does not export _initialize"},
		{"already has _start", testModule([][]byte{cat(name("_initialize"), []byte{fnKind, 2}), cat(name("_start"), []byte{fnKind, 2})}), "already exports _start"},
		{"section size past the end", cat(good[:8], []byte{7, 100, 1, 2}), "past the end"},
		{"export name past the end", cat(good[:8], section(7, cat(appendU32(nil, 1), appendU32(nil, 50), []byte("_init")))), "name past the end"},
		{"truncated LEB128", cat(good[:8], []byte{7, 0x80}), "truncated LEB128"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := WithStartAlias(tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestLEB128(t *testing.T) {
	for _, v := range []uint32{0, 1, 127, 128, 16383, 16384, 1<<28 - 1, 1 << 28, 1<<32 - 1} {
		t.Run(fmt.Sprint(v), func(t *testing.T) {
			enc := appendU32(nil, v)
			got, n, err := readU32(enc)
			if err != nil || got != v || n != len(enc) {
				t.Errorf("readU32(%x) = %d, %d, %v; want %d, %d", enc, got, n, err, v, len(enc))
			}
		})
	}
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"unterminated", []byte{0x80, 0x80}},
		{"overflows u32", []byte{0xff, 0xff, 0xff, 0xff, 0x1f}},
		{"longer than five bytes", []byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x00}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := readU32(tc.in); err == nil {
				t.Errorf("readU32(%x) accepted", tc.in)
			}
		})
	}
}

// FuzzWithStartAlias: arbitrary bytes never panic the rewriter, and whatever it
// accepts still parses as a module with a _start export.
func FuzzWithStartAlias(f *testing.F) {
	f.Add(testModule(nil))
	f.Add([]byte("\x00asm\x01\x00\x00\x00\x07\x01\x00"))
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := WithStartAlias(in)
		if err != nil {
			return
		}
		again, err := WithStartAlias(out)
		if err == nil || !strings.Contains(err.Error(), "already exports _start") {
			t.Fatalf("rewritten module: second rewrite gave %v, want an already-exports-_start error (%x)", err, again)
		}
	})
}

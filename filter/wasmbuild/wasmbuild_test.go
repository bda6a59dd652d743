package wasmbuild_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
	"github.com/tollgate-rl/tollgate/filter/wasmtest"
)

// The committed shim.wasm is what shim.wat compiles
// to: an edit of a source without `go generate` would otherwise ship stale code. Needs
// wat2wasm (Debian wabt, installed by make test).
func TestHelpersUpToDate(t *testing.T) {
	bin, err := exec.LookPath("wat2wasm")
	if err != nil {
		t.Fatalf("wat2wasm not found (apt-get install wabt; make test installs it): %v", err)
	}
	for _, name := range []string{"shim"} {
		out := filepath.Join(t.TempDir(), name+".wasm")
		if msg, err := exec.Command(bin, name+".wat", "-o", out).CombinedOutput(); err != nil {
			t.Fatalf("wat2wasm %s.wat: %v\n%s", name, err, msg)
		}
		want, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(name + ".wasm")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s.wasm is stale: run go generate ./filter/wasmbuild", name)
		}
	}
	if s := wasmbuild.Shimmed(); !slices.Equal(sorted(s), []string{"fd_fdstat_get", "fd_fdstat_set_flags", "poll_oneoff", "sched_yield"}) {
		t.Fatalf("shim defines %v", s)
	}
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

// The Go toolchain's filter imports WASI functions older Envoys lack and calls others
// during _initialize that they refuse; after Link it does neither. The first half shows
// the checks can fail (and that the toolchain still needs the shim).
func TestLinkFilter(t *testing.T) {
	raw, err := wasmbuild.GoBuild("./filter")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("toolchain module fails the checks", func(t *testing.T) {
		rec := &recordingTB{TB: t}
		wasmtest.CheckWASIImports(rec, raw)
		wasmtest.CheckStartup(rec, raw)
		all := strings.Join(rec.errs, "\n")
		for _, want := range []string{"poll_oneoff", "sched_yield", "fd_fdstat_set_flags", "_initialize calls"} {
			if !strings.Contains(all, want) {
				t.Errorf("no complaint about %s; got:\n%s", want, all)
			}
		}
	})
	linked, err := wasmbuild.Link(raw)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("linked module passes", func(t *testing.T) {
		wasmtest.CheckABI(t, linked)
		wasmtest.CheckWASIImports(t, linked)
		wasmtest.CheckStartup(t, linked)
		imports, _, err := wasmtest.ListABI(linked)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range imports {
			if slices.Contains(wasmbuild.Shimmed(), f.Name) && f.Module == wasmbuild.WASIModule {
				t.Errorf("still imports %s", f)
			}
		}
	})
	t.Run("linking is idempotent", func(t *testing.T) {
		again, err := wasmbuild.Link(linked)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, linked) {
			t.Error("a second Link changed a module with nothing left to resolve")
		}
	})
}

// recordingTB collects failures instead of failing, to show a check fails.
type recordingTB struct {
	testing.TB
	errs []string
}

func (r *recordingTB) Helper() {}
func (r *recordingTB) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recordingTB) Fatalf(format string, args ...any) { r.Errorf(format, args...) }

func TestLinkRefusesBadInput(t *testing.T) {
	for name, wasm := range map[string][]byte{
		"empty":     nil,
		"not wasm":  []byte("hello, world"),
		"truncated": {0, 'a', 's', 'm', 1, 0, 0, 0, 1, 10, 0},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := wasmbuild.Link(wasm); err == nil {
				t.Error("Link accepted it")
			}
		})
	}
}

// memoryModule is a module exporting a one-page memory as "memory": what the shim's
// import "tollgate"."memory" binds to when the shim runs on its own.
var memoryModule = []byte{
	0, 'a', 's', 'm', 1, 0, 0, 0,
	5, 3, 1, 0, 1, // memory section: one memory, min 1 page
	7, 10, 1, 6, 'm', 'e', 'm', 'o', 'r', 'y', 2, 0, // export "memory" = memory 0
}

// The shim's answers, called directly: what Go's runtime gets instead of the host's.
func TestShimAnswers(t *testing.T) {
	ctx := context.Background()
	r := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer r.Close(ctx)
	if _, err := r.InstantiateWithConfig(ctx, memoryModule, wazero.NewModuleConfig().WithName("tollgate")); err != nil {
		t.Fatal(err)
	}
	shim, err := os.ReadFile("shim.wasm")
	if err != nil {
		t.Fatal(err)
	}
	m, err := r.InstantiateWithConfig(ctx, shim, wazero.NewModuleConfig().WithName("shim"))
	if err != nil {
		t.Fatal(err)
	}
	mem := m.Memory()
	call := func(name string, args ...uint64) uint32 {
		t.Helper()
		res, err := m.ExportedFunction(name).Call(ctx, args...)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return api.DecodeU32(res[0])
	}

	if e := call("sched_yield"); e != 0 {
		t.Errorf("sched_yield = %d, want 0", e)
	}
	for fd := uint64(0); fd <= 2; fd++ {
		mem.Write(100, bytes.Repeat([]byte{0xAA}, 24))
		if e := call("fd_fdstat_get", fd, 100); e != 0 {
			t.Fatalf("fd_fdstat_get(%d) = %d", fd, e)
		}
		b, _ := mem.Read(100, 24)
		flags := binary.LittleEndian.Uint16(b[2:])
		if b[0] != 2 || flags != 0 || binary.LittleEndian.Uint64(b[8:]) != ^uint64(0) {
			t.Errorf("fd %d: fdstat % x: want a character device without flags (not non-blocking)", fd, b)
		}
	}
	if e := call("fd_fdstat_get", 3, 100); e != 8 {
		t.Errorf("fd_fdstat_get(3) = %d, want EBADF (8)", e)
	}
	if e := call("fd_fdstat_set_flags", 1, 4); e != 58 {
		t.Errorf("fd_fdstat_set_flags = %d, want ENOTSUP (58)", e)
	}

	// Two subscriptions: a clock 10 s away (userdata 7) and a read on fd 0 (userdata 9).
	const in, out, nev = 1000, 2000, 3000
	sub := make([]byte, 96)
	binary.LittleEndian.PutUint64(sub[0:], 7)
	sub[8] = 0 // clock
	binary.LittleEndian.PutUint64(sub[24:], 10e9)
	binary.LittleEndian.PutUint64(sub[48:], 9)
	sub[56] = 1 // fd_read
	mem.Write(in, sub)
	mem.Write(out, bytes.Repeat([]byte{0xAA}, 64))
	if e := call("poll_oneoff", in, out, 2, nev); e != 0 {
		t.Fatalf("poll_oneoff = %d", e)
	}
	if n, _ := mem.ReadUint32Le(nev); n != 2 {
		t.Fatalf("nevents = %d, want 2 (every subscription occurs at once)", n)
	}
	ev, _ := mem.Read(out, 64)
	for i, want := range []struct {
		userdata uint64
		typ      byte
	}{{7, 0}, {9, 1}} {
		e := ev[i*32:]
		if binary.LittleEndian.Uint64(e) != want.userdata || binary.LittleEndian.Uint16(e[8:]) != 0 || e[10] != want.typ ||
			!bytes.Equal(e[11:32], make([]byte, 21)) {
			t.Errorf("event %d: % x, want userdata %d, error 0, type %d, zeros", i, e[:32], want.userdata, want.typ)
		}
	}
	if e := call("poll_oneoff", in, out, 0, nev); e != 28 {
		t.Errorf("poll_oneoff with no subscription = %d, want EINVAL (28)", e)
	}
}

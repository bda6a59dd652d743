package wasmbuild_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
)

// What a packed module gives up: file and line in a traceback. Every frame's function
// is still named, the garbage collector (which walks stacks with the tables that stay)
// still runs, and the module knows the same functions.
func TestPackedTracebackNamesFunctions(t *testing.T) {
	raw := goBuildWASI(t, "./filter/wasmbuild/testdata/traceback")
	packed, st, err := wasmbuild.Pack(raw)
	if err != nil {
		t.Fatal(err)
	}
	if st.LineTables < 10000 {
		t.Fatalf("Pack dropped %d bytes of line tables from a Go program, want tens of thousands", st.LineTables)
	}
	before, err := wasmbuild.MeasureSizes(raw)
	if err != nil {
		t.Fatal(err)
	}
	after, err := wasmbuild.MeasureSizes(packed)
	if err != nil {
		t.Fatal(err)
	}
	names := func(s *wasmbuild.Sizes) []string {
		var n []string
		for _, f := range s.Funcs {
			n = append(n, f.Name)
		}
		slices.Sort(n)
		return n
	}
	if !slices.Equal(names(before), names(after)) || len(names(after)) < 500 {
		t.Errorf("the packed module's function table names %d functions, the toolchain's %d", len(names(after)), len(names(before)))
	}

	for _, m := range []struct {
		name      string
		wasm      []byte
		fileLines bool
	}{{"toolchain", raw, true}, {"packed", packed, false}} {
		stderr := runPanicking(t, m.wasm)
		for _, want := range []string{"panic: boom", "main.explode(", "main.main()"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("%s module's traceback lacks %q:\n%s", m.name, want, stderr)
			}
		}
		if n := strings.Count(stderr, "main.explode("); n != 4 {
			t.Errorf("%s module's traceback has %d frames of main.explode, want 4:\n%s", m.name, n, stderr)
		}
		if got := strings.Contains(stderr, "traceback/main.go:"); got != m.fileLines {
			t.Errorf("%s module's traceback names the source file: %v, want %v:\n%s", m.name, got, m.fileLines, stderr)
		}
	}
}

func goBuildWASI(t *testing.T, pkg string) []byte {
	t.Helper()
	root, err := wasmbuild.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "module.wasm")
	build := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
	build.Dir = root
	build.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if msg, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, msg)
	}
	wasm, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return wasm
}

// runPanicking runs a command module that must exit with Go's panic status, 2, and
// returns what it wrote to stderr.
func runPanicking(t *testing.T, wasm []byte) string {
	t.Helper()
	_, stderr, err := runCommand(wasm)
	if err == nil || !strings.Contains(err.Error(), "exit_code(2)") {
		t.Fatalf("run: %v, want exit code 2\n%s", err, stderr)
	}
	return string(stderr)
}

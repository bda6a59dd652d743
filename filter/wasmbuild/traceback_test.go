package wasmbuild_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
)

// A panic in a module built as Build builds the filter (shim linked, jumps threaded,
// optimized) prints a traceback that names every frame's function with its file and
// line, as the toolchain's module does: no step drops the runtime's line tables.
func TestTracebackNamesFileAndLine(t *testing.T) {
	raw := goBuildWASI(t, "./filter/wasmbuild/testdata/traceback")
	linked, err := wasmbuild.Link(raw)
	if err != nil {
		t.Fatal(err)
	}
	threaded, _, err := wasmbuild.Thread(linked)
	if err != nil {
		t.Fatal(err)
	}
	built, err := wasmbuild.Optimize(threaded)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct {
		name string
		wasm []byte
	}{{"toolchain", raw}, {"built", built}} {
		stderr := runPanicking(t, m.wasm)
		for _, want := range []string{"panic: boom", "main.explode(", "main.main()", "traceback/main.go:"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("%s module's traceback lacks %q:\n%s", m.name, want, stderr)
			}
		}
		if n := strings.Count(stderr, "main.explode("); n != 4 {
			t.Errorf("%s module's traceback has %d frames of main.explode, want 4:\n%s", m.name, n, stderr)
		}
		if strings.Contains(stderr, "?:0") {
			t.Errorf("%s module's traceback has frames without file and line:\n%s", m.name, stderr)
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

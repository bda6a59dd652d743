package wasmbuild_test

import (
	"bytes"
	"context"
	"os/exec"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
)

// A Go program's output is the same natively, as the toolchain's module, threaded,
// and threaded then optimized, as Build does it: jumps of every kind,
// panics recovered, goroutines switching (resumptions through the dispatch Thread
// leaves alone) and garbage collections. The whole filter suite runs the shipped module
// besides.
func TestThreadKeepsBehaviour(t *testing.T) {
	root, err := wasmbuild.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	pkg := "./filter/wasmbuild/testdata/jumps"
	native := exec.Command("go", "run", pkg)
	native.Dir = root
	want, err := native.Output()
	if err != nil {
		t.Fatalf("go run %s: %v", pkg, err)
	}

	raw := goBuildWASI(t, pkg)
	threaded, st, err := wasmbuild.Thread(raw)
	if err != nil {
		t.Fatal(err)
	}
	// Every Go function that calls another has the shape; a toolchain that changed it
	// would leave the pass doing nothing, silently.
	if st.Funcs < 500 || st.Threaded < 5*st.Backward || st.Loops == 0 || st.Looped == 0 || st.Skipped > 0 {
		t.Fatalf("threaded %+v: want hundreds of resumable functions, most jumps forward, loops left", st)
	}
	t.Logf("%+v", st)
	optimized, err := wasmbuild.Optimize(threaded)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct {
		name string
		wasm []byte
	}{{"toolchain", raw}, {"threaded", threaded}, {"threaded and optimized", optimized}} {
		if got := runWASI(t, m.wasm); !bytes.Equal(got, want) {
			t.Errorf("%s module printed\n%s\nnatively\n%s", m.name, got, want)
		}
	}
}

func runWASI(t *testing.T, wasm []byte) []byte {
	t.Helper()
	stdout, stderr, err := runCommand(wasm)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr)
	}
	return stdout
}

// runCommand runs a WASI command module under wazero and returns what it wrote to
// stdout and stderr, and how it ended.
func runCommand(wasm []byte) (stdout, stderr []byte, err error) {
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	var out, errOut bytes.Buffer
	_, err = rt.InstantiateWithConfig(ctx, wasm, wazero.NewModuleConfig().WithStdout(&out).WithStderr(&errOut))
	return out.Bytes(), errOut.Bytes(), err
}

// The filter Build ships is threaded: Thread of its linked stage finds the resumable
// functions, threads jumps and rewrites loops without skipping any, and the stage Build
// optimizes is exactly that output.
func TestBuildThreadsTheFilter(t *testing.T) {
	st, err := wasmbuild.BuildStages("./filter")
	if err != nil {
		t.Fatal(err)
	}
	threaded, stats, err := wasmbuild.Thread(st.Linked)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", stats)
	if !bytes.Equal(threaded, st.Threaded) || bytes.Equal(st.Threaded, st.Linked) {
		t.Fatal("Build's threaded stage is not Thread's output of its linked one")
	}
	if stats.Funcs < 1000 || stats.Threaded < 10000 || stats.Loops < 500 || stats.Skipped > 0 {
		t.Fatalf("threaded %+v: want the filter's functions threaded, its loops rewritten, none skipped", stats)
	}
}

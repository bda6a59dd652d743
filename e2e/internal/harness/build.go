// Package harness runs Tollgate's moving parts for the end-to-end suite and the demo:
// the sync service as real child processes (so a scenario can SIGKILL one), gateways that
// run the compiled filter on the wazero host (internal/wazerohost) behind a real HTTP listener, a
// small upstream, an admin client for the rules and usage API, and a paced HTTP load
// generator that records what every answer said. Everything listens on loopback ports
// chosen by the kernel and is stopped by its Close/Stop method.
//
// Nothing here takes a *testing.T: the demo uses the same pieces outside a test.
package harness

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
)

// Binaries are the programs a run needs, built once per process.
type Binaries struct {
	Dir     string // temporary directory holding them; Remove deletes it
	Service string // tollgate-ratelimit executable
	Wasm    []byte // the filter (build/filter.wasm recipe)
}

// Remove deletes the temporary directory.
func (b *Binaries) Remove() {
	if b != nil && b.Dir != "" {
		_ = os.RemoveAll(b.Dir)
	}
}

// RepoRoot is the directory of Tollgate's go.mod (the go command's view of the module).
func RepoRoot() (string, error) { return wasmbuild.RepoRoot() }

// Build compiles the sync service and the filter with the recipes of the Makefile
// (`make build`, `make wasm`) into a new temporary directory. Building here rather than
// reusing build/ keeps a run from testing a stale binary; the go build cache makes it
// cheap when nothing changed.
func Build() (*Binaries, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tollgate-e2e-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	b := &Binaries{Dir: dir, Service: filepath.Join(dir, "tollgate-ratelimit")}
	if err := goBuild(root, nil, "-o", b.Service, "./ratelimit/cmd/tollgate-ratelimit"); err != nil {
		b.Remove()
		return nil, err
	}
	if b.Wasm, err = wasmbuild.Build("./filter"); err != nil {
		b.Remove()
		return nil, err
	}
	return b, nil
}

func goBuild(root string, env []string, args ...string) error {
	cmd := exec.Command("go", append([]string{"build", "-trimpath", "-buildvcs=false"}, args...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", strings.Join(args, " "), err, out.Bytes())
	}
	return nil
}

// BuildFilterAt compiles the filter as it was at commit of this repository (git archive
// into a temporary directory, then the recipe of `make wasm`): the gateway of an earlier
// release, for the rolling-upgrade scenario. It needs the repository's git history (a
// shallow clone without that commit fails with git's message).
func BuildFilterAt(commit string) ([]byte, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tollgate-e2e-old-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	archive := exec.Command("git", "-C", root, "archive", "--format=tar", commit)
	var errOut bytes.Buffer
	archive.Stderr = &errOut
	tarball, err := archive.Output()
	if err != nil {
		return nil, fmt.Errorf("git archive %s: %w: %s", commit, err, errOut.Bytes())
	}
	untar := exec.Command("tar", "-x", "-C", dir)
	untar.Stdin = bytes.NewReader(tarball)
	if out, err := untar.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("extract %s: %w: %s", commit, err, out)
	}
	wasmPath := filepath.Join(dir, "filter.wasm")
	if err := goBuild(dir, []string{"GOOS=wasip1", "GOARCH=wasm"}, "-buildmode=c-shared", "-o", wasmPath, "./filter"); err != nil {
		return nil, fmt.Errorf("filter at %s: %w", commit, err)
	}
	wasm, err := os.ReadFile(wasmPath)
	if err != nil {
		return nil, fmt.Errorf("read %q: %w", wasmPath, err)
	}
	return wasm, nil
}

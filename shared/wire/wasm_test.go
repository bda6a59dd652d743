package wire

import (
	"os"
	"os/exec"
	"testing"
)

// The filter compiles shared/ to wasip1; a dependency that does not (net, os/exec,
// cgo, reflection-heavy libraries with unsupported syscalls) must fail here, natively,
// rather than in the wasm build.
func TestBuildsForWasip1(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go not on PATH: %v", err)
	}
	cmd := exec.Command(gobin, "build", "./shared/wire", "./shared/header", "./shared/refusal")
	cmd.Dir = "../.." // module root
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("GOOS=wasip1 GOARCH=wasm go build ./shared/wire ./shared/header ./shared/refusal: %v\n%s", err, out)
	}
}

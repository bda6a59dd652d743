package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// repoRoot is the main module's directory (this module sits at deploy/k8s).
const repoRoot = "../../.."

// TestImagesThroughRegistry builds both images from the compiled filter and a static
// service binary, writes them as OCI layouts, pushes them to an in-process registry and
// pulls them back: the filter image passes the checks istio-agent makes on a compat
// image and carries the module byte for byte; the service image runs --help from the
// pulled binary as the non-root user its configuration names.
func TestImagesThroughRegistry(t *testing.T) {
	module, err := os.ReadFile(filepath.Join(repoRoot, "build/filter.wasm"))
	if err != nil {
		t.Fatalf("the compiled filter is needed (make build): %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "tollgate-ratelimit")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./ratelimit/cmd/tollgate-ratelimit")
	build.Dir = repoRoot
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	binary, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := os.ReadFile(CACertsPath)
	if err != nil {
		t.Fatalf("a CA bundle at %s (Debian: ca-certificates): %v", CACertsPath, err)
	}
	m := Meta{Version: "v0.0.0-test", Revision: "abc123", Created: time.Unix(1_700_000_000, 0)}
	wimg, err := WasmImage(module, m)
	if err != nil {
		t.Fatal(err)
	}
	simg, err := ServiceImage(binary, certs, runtime.GOARCH, m)
	if err != nil {
		t.Fatal(err)
	}

	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	pushPull := func(t *testing.T, img v1.Image, repo string) v1.Image {
		t.Helper()
		// Through a layout on disk, as make oci writes them.
		lay := filepath.Join(dir, repo)
		if err := WriteLayout(lay, "v0.0.0-test", img); err != nil {
			t.Fatal(err)
		}
		fromDisk, err := ReadLayout(lay)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := name.ParseReference(host+"/tollgate/"+repo+":v0.0.0-test", name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(ref, fromDisk); err != nil {
			t.Fatalf("push: %v", err)
		}
		pulled, err := remote.Image(ref)
		if err != nil {
			t.Fatalf("pull: %v", err)
		}
		want, _ := img.Digest()
		if got, _ := pulled.Digest(); got != want {
			t.Fatalf("pulled digest %s, built %s", got, want)
		}
		return pulled
	}

	t.Run("filter", func(t *testing.T) {
		pulled := pushPull(t, wimg, "filter")
		got, err := istioCompatWasm(pulled)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, module) {
			t.Fatalf("module from the registry: %d bytes, differs from build/filter.wasm (%d bytes)", len(got), len(module))
		}
		mt, _ := pulled.MediaType()
		if mt != types.OCIManifestSchema1 {
			t.Fatalf("manifest media type %s", mt)
		}
	})

	t.Run("service", func(t *testing.T) {
		pulled := pushPull(t, simg, "tollgate-ratelimit")
		cf, err := pulled.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		uid, gid, err := numericUser(cf.Config.User)
		if err != nil || uid == 0 {
			t.Fatalf("config user %q: want a numeric non-root uid:gid (%v)", cf.Config.User, err)
		}
		for _, k := range []string{"title", "description", "version", "revision", "created"} {
			if cf.Config.Labels["org.opencontainers.image."+k] == "" {
				t.Errorf("label org.opencontainers.image.%s missing: %v", k, cf.Config.Labels)
			}
		}
		if len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != ServiceBinary || cf.OS != "linux" {
			t.Fatalf("entrypoint %q, os %q", cf.Config.Entrypoint, cf.OS)
		}
		files := extract(t, pulled)
		if !bytes.Equal(files[CACertsPath[1:]], certs) {
			t.Errorf("CA certificates at %s: %d bytes, want the bundle", CACertsPath, len(files[CACertsPath[1:]]))
		}
		if !strings.Contains(string(files["etc/passwd"]), ":"+strconv.Itoa(uid)+":") {
			t.Errorf("/etc/passwd does not name uid %d: %q", uid, files["etc/passwd"])
		}
		// Nothing but what the service needs (and directories): no shell, no package manager.
		for name := range files {
			switch name {
			case ServiceBinary[1:], CACertsPath[1:], "etc/passwd", "etc/group":
			default:
				t.Errorf("unexpected file in the image: %s", name)
			}
		}

		// A directory the image's user can enter (t.TempDir's parent is 0700).
		exeDir, err := os.MkdirTemp("", "tollgate-oci-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(exeDir) })
		exe := filepath.Join(exeDir, "from-image")
		if err := os.WriteFile(exe, files[ServiceBinary[1:]], 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(exe, "--help")
		if os.Geteuid() == 0 {
			// As the image's user, the way a runtime would start it.
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
			if err := os.Chmod(exeDir, 0o755); err != nil {
				t.Fatal(err)
			}
		} else {
			t.Logf("not root: --help runs as uid %d, not the image's %d", os.Geteuid(), uid)
		}
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "Usage: tollgate-ratelimit") {
			t.Fatalf("--help from the image: %v\n%s", err, out)
		}
	})
}

// istioCompatWasm applies istio-agent's rules for a compat-variant Wasm image (OCI
// manifest): exactly one layer, of type application/vnd.oci.image.layer.v1.tar+gzip,
// a gzipped tar holding plugin.wasm; the module is that file.
func istioCompatWasm(img v1.Image) ([]byte, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	if len(layers) != 1 {
		return nil, fmt.Errorf("%d layers, istio-agent wants 1", len(layers))
	}
	mt, err := layers[0].MediaType()
	if err != nil {
		return nil, err
	}
	if mt != types.OCILayer {
		return nil, fmt.Errorf("layer media type %s, istio-agent wants %s", mt, types.OCILayer)
	}
	rc, err := layers[0].Compressed()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	gz, err := gzip.NewReader(rc)
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("no %s in the layer", WasmFileName)
		}
		if err != nil {
			return nil, err
		}
		if filepath.Base(h.Name) == WasmFileName {
			return io.ReadAll(tr)
		}
	}
}

// extract reads the image's flattened file system.
func extract(t *testing.T, img v1.Image) map[string][]byte {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeDir {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
	}
}

func numericUser(u string) (uid, gid int, err error) {
	us, gs, ok := strings.Cut(u, ":")
	if !ok {
		return 0, 0, fmt.Errorf("no group in %q", u)
	}
	if uid, err = strconv.Atoi(us); err != nil {
		return 0, 0, err
	}
	gid, err = strconv.Atoi(gs)
	return uid, gid, err
}

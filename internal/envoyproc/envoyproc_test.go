package envoyproc

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
)

// TestMakefileInstallsReleases keeps the Makefile's ENVOY_RELEASES and Releases equal:
// the suite must run on exactly what `make envoy` installs.
func TestMakefileInstallsReleases(t *testing.T) {
	root, err := wasmbuild.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile(root + "/Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ENVOY_RELEASES := (.*)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile: no ENVOY_RELEASES line")
	}
	if got, want := strings.Fields(string(m[1])), Releases; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("Makefile ENVOY_RELEASES = %v, envoyproc.Releases = %v", got, want)
	}
}

// TestReleasesStart starts each installed release with an admin listener only and reads
// its version back: the binary runs here, and Start/Stop work.
func TestReleasesStart(t *testing.T) {
	root, err := wasmbuild.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range Releases {
		t.Run(v, func(t *testing.T) {
			bin, err := Binary(root, v)
			if err != nil {
				t.Fatal(err) // make test installs them: a missing release fails, never skips
			}
			got, err := Version(bin)
			if err != nil || got != v {
				t.Fatalf("Version = %q, %v; want %q", got, err, v)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			p, err := Start(ctx, Options{Binary: bin, Dir: t.TempDir(), Config: []byte(
				"admin:\n  address:\n    socket_address: {address: 127.0.0.1, port_value: 0}\n")})
			if err != nil {
				t.Fatal(err)
			}
			body, err := p.Get(ctx, "/server_info")
			if err != nil || !strings.Contains(body, v) {
				t.Errorf("/server_info: %v, does not name %s", err, v)
			}
			if err := p.Stop(); err != nil {
				t.Fatal(err)
			}
			if !p.Exited() {
				t.Fatal("still running after Stop")
			}
		})
	}
}

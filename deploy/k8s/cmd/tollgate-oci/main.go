// Command tollgate-oci writes Tollgate's images as OCI image layouts (`make oci`):
// the filter image for Istio's WasmPlugin and the sync service image. No container
// runtime and no base image are needed; push a layout with any OCI client, e.g.
//
//	crane push build/oci/filter registry.example.com/tollgate/filter:v0.1.0
//	crane push build/oci/tollgate-ratelimit registry.example.com/tollgate/tollgate-ratelimit:v0.1.0
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/tollgate-rl/tollgate/deploy/k8s/oci"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "tollgate-oci:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("tollgate-oci", flag.ContinueOnError)
	wasm := fs.String("wasm", "build/filter.wasm", "the filter module")
	bin := fs.String("service", "build/oci/tollgate-ratelimit-linux-amd64", "the service binary, built static (CGO_ENABLED=0) for linux")
	arch := fs.String("arch", "amd64", "the service binary's architecture (GOARCH)")
	ca := fs.String("ca-certs", oci.CACertsPath, "PEM CA bundle copied into the service image")
	out := fs.String("out", "build/oci", "directory of the two layouts (filter/, tollgate-ratelimit/)")
	version := fs.String("version", "dev", "image version (label org.opencontainers.image.version and the layouts' tag)")
	revision := fs.String("revision", "", "source revision (label org.opencontainers.image.revision)")
	source := fs.String("source", "", "source repository URL (label org.opencontainers.image.source)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// Reproducible digests: times come from SOURCE_DATE_EPOCH when set, else the epoch.
	created := time.Unix(0, 0).UTC()
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
		}
		created = time.Unix(n, 0).UTC()
	}
	m := oci.Meta{Version: *version, Revision: *revision, Source: *source, Created: created}

	module, err := os.ReadFile(*wasm)
	if err != nil {
		return fmt.Errorf("--wasm: %w (make wasm builds it)", err)
	}
	wimg, err := oci.WasmImage(module, m)
	if err != nil {
		return err
	}
	binary, err := os.ReadFile(*bin)
	if err != nil {
		return fmt.Errorf("--service: %w", err)
	}
	certs, err := os.ReadFile(*ca)
	if err != nil {
		return fmt.Errorf("--ca-certs: %w", err)
	}
	simg, err := oci.ServiceImage(binary, certs, *arch, m)
	if err != nil {
		return err
	}
	for name, img := range map[string]v1.Image{"filter": wimg, "tollgate-ratelimit": simg} {
		dir := filepath.Join(*out, name)
		if err := oci.WriteLayout(dir, *version, img); err != nil {
			return fmt.Errorf("write %s: %w", dir, err)
		}
		d, err := img.Digest()
		if err != nil {
			return err
		}
		fmt.Printf("%s\t%s\n", dir, d)
	}
	return nil
}

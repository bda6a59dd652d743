// Package oci builds Tollgate's two images without a container runtime, with
// go-containerregistry, as OCI image layouts that any registry client (crane, oras,
// skopeo) can push:
//
//   - the filter image, in the format istio-agent pulls for a WasmPlugin's
//     oci:// URL: Istio's "compat" variant, one gzipped tar layer holding plugin.wasm;
//   - the sync service image: the static binary on an empty base with a non-root
//     user, CA certificates and OCI labels. No base image is pulled.
//
// Why the compat variant and not the "oci" variant (a raw layer of type
// application/vnd.module.wasm.content.layer.v1+wasm): istio-agent reads the compat
// variant first, and its oci-variant reader requires exactly two layers, a shape only
// one external tool produced; a one-layer artifact of that type is refused.
package oci

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// WasmFileName is the file istio-agent looks for in a compat-variant layer.
const WasmFileName = "plugin.wasm"

// ServiceBinary is the service's path inside its image (the entrypoint).
const ServiceBinary = "/tollgate-ratelimit"

// CACertsPath is where the image carries CA certificates: the first path Go's
// crypto/x509 reads on Linux.
const CACertsPath = "/etc/ssl/certs/ca-certificates.crt"

// NonRootUID is the service's user and group id: not 0, and not a name (Kubernetes'
// runAsNonRoot can only verify a numeric user).
const NonRootUID = 65532

// Meta is what both images are labelled with (org.opencontainers.image.*).
type Meta struct {
	Version  string    // org.opencontainers.image.version, e.g. v0.1.0
	Revision string    // org.opencontainers.image.revision (a commit), optional
	Source   string    // org.opencontainers.image.source, optional
	Created  time.Time // image and file times; fixed for reproducible digests
}

func (m Meta) labels(title, description string) map[string]string {
	l := map[string]string{
		"org.opencontainers.image.title":       title,
		"org.opencontainers.image.description": description,
		"org.opencontainers.image.version":     m.Version,
		"org.opencontainers.image.created":     m.Created.UTC().Format(time.RFC3339),
	}
	if m.Revision != "" {
		l["org.opencontainers.image.revision"] = m.Revision
	}
	if m.Source != "" {
		l["org.opencontainers.image.source"] = m.Source
	}
	return l
}

// file is one entry of a layer.
type file struct {
	name string
	mode int64
	uid  int
	data []byte
	dir  bool
}

// tarLayer is a gzipped OCI layer of files, in name order with fixed times.
func tarLayer(files []file, mtime time.Time) (v1.Layer, error) {
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.uid, ModTime: mtime, Format: tar.FormatPAX}
		if f.dir {
			h.Typeflag, h.Name = tar.TypeDir, f.name+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// WasmImage is the filter's image: one layer holding module as plugin.wasm.
func WasmImage(module []byte, m Meta) (v1.Image, error) {
	if len(module) < 8 || !bytes.Equal(module[:4], []byte("\x00asm")) {
		return nil, fmt.Errorf("oci: the filter module is not WebAssembly (no \\0asm header)")
	}
	layer, err := tarLayer([]file{{name: WasmFileName, mode: 0o444, data: module}}, m.Created)
	if err != nil {
		return nil, err
	}
	cfg := &v1.ConfigFile{
		Created: v1.Time{Time: m.Created}, Architecture: "wasm", OS: "wasip1",
		Config: v1.Config{Labels: m.labels("tollgate-filter",
			"Tollgate rate-limit filter (proxy-wasm) for Envoy and Istio WasmPlugin")},
	}
	return build(cfg, layer, "tollgate-oci: "+WasmFileName, m.Created)
}

// build is an OCI image of cfg and one layer (Append fills in the rootfs and history).
func build(cfg *v1.ConfigFile, layer v1.Layer, createdBy string, created time.Time) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cfg.RootFS = v1.RootFS{Type: "layers"}
	img, err := mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, err
	}
	return mutate.Append(img, mutate.Addendum{Layer: layer, MediaType: types.OCILayer,
		History: v1.History{Created: v1.Time{Time: created}, CreatedBy: createdBy}})
}

// ServiceImage is the sync service's image for GOOS linux and arch: binary (built
// static, CGO_ENABLED=0) as the entrypoint, caCerts (PEM) at CACertsPath, /etc/passwd
// and /etc/group naming the non-root user, and nothing else: no shell, no base image.
func ServiceImage(binary, caCerts []byte, arch string, m Meta) (v1.Image, error) {
	if len(binary) < 4 || !bytes.Equal(binary[:4], []byte("\x7fELF")) {
		return nil, fmt.Errorf("oci: the service binary is not an ELF executable")
	}
	if !bytes.Contains(caCerts, []byte("-----BEGIN CERTIFICATE-----")) {
		return nil, fmt.Errorf("oci: no PEM certificate in the CA bundle")
	}
	uid := fmt.Sprint(NonRootUID)
	files := []file{
		{name: "etc", dir: true, mode: 0o755},
		{name: "etc/ssl", dir: true, mode: 0o755},
		{name: "etc/ssl/certs", dir: true, mode: 0o755},
		{name: path.Clean(CACertsPath[1:]), mode: 0o444, data: caCerts},
		{name: "etc/passwd", mode: 0o444, data: []byte("root:x:0:0:root:/:/sbin/nologin\ntollgate:x:" + uid + ":" + uid + ":tollgate:/:/sbin/nologin\n")},
		{name: "etc/group", mode: 0o444, data: []byte("root:x:0:\ntollgate:x:" + uid + ":\n")},
		{name: "tmp", dir: true, mode: 0o1777},
		{name: ServiceBinary[1:], mode: 0o555, data: binary},
	}
	layer, err := tarLayer(files, m.Created)
	if err != nil {
		return nil, err
	}
	cfg := &v1.ConfigFile{
		Created: v1.Time{Time: m.Created}, Architecture: arch, OS: "linux",
		Config: v1.Config{
			Entrypoint:   []string{ServiceBinary},
			User:         uid + ":" + uid,
			WorkingDir:   "/",
			Env:          []string{"SSL_CERT_FILE=" + CACertsPath},
			ExposedPorts: map[string]struct{}{"8081/tcp": {}, "8082/tcp": {}},
			Labels: m.labels("tollgate-ratelimit",
				"Tollgate sync service: applies gateways' rate-limit reports to Redis"),
		},
	}
	return build(cfg, layer, "tollgate-oci: tollgate-ratelimit, CA certificates, passwd", m.Created)
}

// WriteLayout writes img as the only image of a new OCI image layout at dir, tagged
// ref (the org.opencontainers.image.ref.name annotation crane and skopeo read). An
// existing layout at dir is replaced.
func WriteLayout(dir, ref string, img v1.Image) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref}))
}

// ReadLayout returns the only image of the layout at dir.
func ReadLayout(dir string) (v1.Image, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, err
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(im.Manifests) != 1 {
		return nil, fmt.Errorf("oci: layout %s holds %d images, want 1", dir, len(im.Manifests))
	}
	return idx.Image(im.Manifests[0].Digest)
}

package wasmbuild

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// OptimizerArgs are wasm-opt's arguments: optimize for size, and allow exactly the
// WebAssembly features Go's wasm backend emits (bulk memory, sign extension,
// saturating float conversions, mutable globals), so the optimizer cannot introduce an
// instruction the module did not already need from the host's Wasm runtime.
var OptimizerArgs = []string{"-Oz", "--enable-bulk-memory", "--enable-sign-ext",
	"--enable-nontrapping-float-to-int", "--enable-mutable-globals"}

// Optimize runs binaryen's wasm-opt (Debian package binaryen; `make wasm` installs it)
// over wasm with OptimizerArgs. It takes tens of seconds and a few hundred megabytes
// for the filter, so results are kept in the user's cache directory under the SHA-256
// of the input, the arguments and wasm-opt's version; entries unused for a week are
// removed.
func Optimize(wasm []byte) ([]byte, error) { return optimize(wasm, OptimizerArgs) }

// optimize is Optimize with wasm-opt's arguments args.
func optimize(wasm []byte, args []string) ([]byte, error) {
	bin, err := exec.LookPath("wasm-opt")
	if err != nil {
		return nil, fmt.Errorf("wasm-opt not found (apt-get install binaryen; make wasm installs it): %w", err)
	}
	version, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("wasm-opt --version: %w", err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00", bytes.TrimSpace(version), strings.Join(args, " "))
	h.Write(wasm)
	key := hex.EncodeToString(h.Sum(nil))

	cache := ""
	if dir, err := os.UserCacheDir(); err == nil {
		cache = filepath.Join(dir, "tollgate-wasm-opt")
		if out, err := os.ReadFile(filepath.Join(cache, key+".wasm")); err == nil {
			now := time.Now()
			os.Chtimes(filepath.Join(cache, key+".wasm"), now, now) // in use: keep it
			return out, nil
		}
	}

	dir, err := os.MkdirTemp("", "tollgate-wasm-opt-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	in, out := filepath.Join(dir, "in.wasm"), filepath.Join(dir, "out.wasm")
	if err := os.WriteFile(in, wasm, 0o644); err != nil {
		return nil, err
	}
	if msg, err := exec.Command(bin, append(slices.Clip(args), in, "-o", out)...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("wasm-opt: %w\n%s", err, msg)
	}
	opt, err := os.ReadFile(out)
	if err != nil {
		return nil, err
	}
	if cache != "" {
		storeOptimized(cache, key, opt)
	}
	return opt, nil
}

// storeOptimized writes an entry (atomically: concurrent builds may race) and prunes
// entries unused for a week. A cache that cannot be written only costs time.
func storeOptimized(cache, key string, wasm []byte) {
	if os.MkdirAll(cache, 0o755) != nil {
		return
	}
	tmp, err := os.CreateTemp(cache, "tmp-")
	if err != nil {
		return
	}
	_, werr := tmp.Write(wasm)
	if cerr := tmp.Close(); werr != nil || cerr != nil || os.Rename(tmp.Name(), filepath.Join(cache, key+".wasm")) != nil {
		os.Remove(tmp.Name())
		return
	}
	entries, _ := os.ReadDir(cache)
	for _, e := range entries {
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > 7*24*time.Hour {
			os.Remove(filepath.Join(cache, e.Name()))
		}
	}
}

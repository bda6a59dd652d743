package wazerohost

import (
	"os"
	"strings"
	"testing"
)

// The host modes refuse what the Envoy releases they stand for refused: a WASI import
// added in 1.33 does not load before it, and a long-standing WASI function called during
// _initialize outside the start-up allow-list traps the VM there.
func TestWASIModes(t *testing.T) {
	read := func(name string) []byte {
		b, err := os.ReadFile("testdata/wasi/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	schedYield, startupFdClose := read("imports_sched_yield.wasm"), read("startup_fd_close.wasm")
	tests := []struct {
		name    string
		wasm    []byte
		mode    WASIMode
		wantErr string // empty: starts
	}{
		{"sched_yield import, full WASI", schedYield, WASIFull, ""},
		{"sched_yield import, Envoy 1.33-1.38", schedYield, WASIEnvoy133, ""},
		{"sched_yield import, Envoy before 1.33", schedYield, WASILegacy, "imports wasi_snapshot_preview1.sched_yield, which Envoy before 1.33 does not offer"},
		{"fd_close at start-up, full WASI", startupFdClose, WASIFull, ""},
		{"fd_close at start-up, Envoy 1.33-1.38", startupFdClose, WASIEnvoy133, "wasi fd_close called during _initialize"},
		{"fd_close at start-up, Envoy before 1.33", startupFdClose, WASILegacy, "wasi fd_close called during _initialize"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := New(Config{Wasm: tt.wasm, WASI: tt.mode})
			if err == nil {
				defer h.Close()
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("New: %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

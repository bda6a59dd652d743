// Command empty is the benchmark baseline: a pass-through filter that answers Continue
// to every callback and makes no host call, so measuring it measures the host plus the
// binding's dispatch and nothing else. Build it like the filter:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared ./filter/bench/empty
package main

import "github.com/tollgate-rl/tollgate/filter/abi"

func init() { abi.SetRoot(root{}) }

// main never runs: the module is a WASI reactor.
func main() {}

type root struct{}

func (root) OnVMStart([]byte) bool                          { return true }
func (root) OnPluginStart([]byte) bool                      { return true }
func (root) OnTick()                                        {}
func (root) OnHTTPCallResponse(uint32, [][2]string, []byte) {}
func (root) NewStream(uint32) abi.Stream                    { return stream{} }

type stream struct{}

func (stream) OnRequestHeaders(int, bool) abi.Action  { return abi.Continue }
func (stream) OnResponseHeaders(int, bool) abi.Action { return abi.Continue }
func (stream) OnLog()                                 {}
func (stream) OnDone()                                {}

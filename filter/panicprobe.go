//go:build tollgate_panicprobe

package main

import (
	"github.com/tollgate-rl/tollgate/filter/abi"
	"github.com/tollgate-rl/tollgate/filter/plugin"
)

// panicHeader marks the request on which a module built with the tollgate_panicprobe tag
// dies with a fatal runtime error: the end-to-end suite's VM that fails (e2e
// TestVMFailure), to see each host answer as the plugin's failure policy says. The
// shipped module has no such code.
const panicHeader = "x-tollgate-test-panic"

// init runs after main.go's (files initialise in name order) and replaces its root with
// one whose streams die on a marked request.
func init() {
	abi.SetRoot(panicRoot{root{plugin.New(&host{})}})
}

type panicRoot struct{ root }

func (r panicRoot) NewStream(id uint32) abi.Stream {
	return panicStream{stream{r.Plugin.NewStream(id)}}
}

type panicStream struct{ stream }

func (s panicStream) OnRequestHeaders(n int, eos bool) abi.Action {
	var h host
	hs, _ := h.RequestHeaders()
	for _, kv := range hs {
		if kv[0] == panicHeader {
			// A panic would be recovered by the binding (filter/abi leave), which is
			// what it is for; blocking forever inside an export is a fatal error the
			// runtime cannot recover from ("all goroutines are asleep"): the runtime
			// exits, and the host fails the VM.
			select {}
		}
	}
	return s.stream.OnRequestHeaders(n, eos)
}

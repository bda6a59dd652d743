//go:build !tollgate_gcprobe

package main

// probeRequest does nothing in the shipped module (gcprobe.go is the test build's).
func probeRequest() {}

// The request-path trace of the soak's test build (gcprobe.go); nothing here.
func probeCallback(int)             {}
func probeContext(uint32)           {}
func probeHeadersStart(uint32)      {}
func probeHeadersDone(uint32, bool) {}
func probeDone(uint32)              {}

const (
	probeCalloutSent = iota
	probeCalloutAnswered
	probeTicked
	probeReplied
	probeResumed
)

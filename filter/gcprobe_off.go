//go:build !tollgate_gcprobe

package main

// probeRequest does nothing in the shipped module (gcprobe.go is the test build's).
func probeRequest() {}

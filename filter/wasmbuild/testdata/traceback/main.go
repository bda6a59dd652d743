// Command traceback dies of a panic three calls deep, after garbage collections, so a
// test can read the traceback a built module prints.
package main

import "runtime"

var sink [][]byte

//go:noinline
func explode(n int) {
	if n == 0 {
		panic("boom")
	}
	explode(n - 1)
}

func main() {
	for range 1000 {
		sink = append(sink, make([]byte, 1024))
	}
	runtime.GC()
	explode(3)
}

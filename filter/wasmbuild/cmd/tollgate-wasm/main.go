// Command tollgate-wasm builds a proxy-wasm module the way Tollgate ships it (see
// package wasmbuild): `make wasm` runs
//
//	go run ./filter/wasmbuild/cmd/tollgate-wasm -o build/filter.wasm ./filter
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
)

func main() {
	out := flag.String("o", "", "output file (required)")
	tags := flag.String("tags", "", "comma-separated build tags")
	flag.Parse()
	if *out == "" || flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: tollgate-wasm -o out.wasm [-tags a,b] ./package")
		os.Exit(2)
	}
	var tagList []string
	if *tags != "" {
		tagList = strings.Split(*tags, ",")
	}
	wasm, err := wasmbuild.Build(flag.Arg(0), tagList...)
	if err == nil {
		err = os.WriteFile(*out, wasm, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tollgate-wasm:", err)
		os.Exit(1)
	}
	fmt.Printf("%s: %d bytes\n", *out, len(wasm))
}

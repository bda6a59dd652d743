// Command tollgate-wasm builds a proxy-wasm module the way Tollgate ships it (see
// package wasmbuild): `make wasm` runs
//
//	go run ./filter/wasmbuild/cmd/tollgate-wasm -o build/filter.wasm ./filter
//
// With -sizes it also prints where the module's bytes go, per section and per Go
// package (wasmbuild.MeasureSizes), measured on the module before the optimizer, whose
// output no longer says which function came from which package:
//
//	go run ./filter/wasmbuild/cmd/tollgate-wasm -sizes ./filter
//
// With -names the module keeps the Go functions' names (wasmbuild.Recipe.Names), for a
// profiler: BenchmarkDecision in bench/perf says how to profile the guest with it.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
)

func main() {
	out := flag.String("o", "", "output file (required unless -sizes)")
	tags := flag.String("tags", "", "comma-separated build tags")
	sizes := flag.Bool("sizes", false, "print where the bytes go")
	top := flag.Int("top", 40, "with -sizes: packages to list (0: all)")
	funcs := flag.Int("funcs", 25, "with -sizes: largest functions to list")
	names := flag.Bool("names", false, "keep the functions' names (for profiling; not the shipped module)")
	var rc wasmbuild.Recipe
	flag.BoolVar(&rc.NoThread, "no-thread", false, "skip Thread (to measure what it gives; not the shipped module)")
	flag.Parse()
	if (*out == "" && !*sizes) || (*names && *sizes) || flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: tollgate-wasm [-o out.wasm] [-sizes [-top n] [-funcs n]] [-names] [-tags a,b] ./package")
		os.Exit(2)
	}
	var tagList []string
	if *tags != "" {
		tagList = strings.Split(*tags, ",")
	}
	rc.Names = *names
	if err := run(flag.Arg(0), *out, tagList, *sizes, rc, *top, *funcs); err != nil {
		fmt.Fprintln(os.Stderr, "tollgate-wasm:", err)
		os.Exit(1)
	}
}

func run(pkg, out string, tags []string, sizes bool, rc wasmbuild.Recipe, top, funcs int) error {
	if !sizes {
		wasm, err := rc.Build(pkg, tags...)
		if err != nil {
			return err
		}
		if err := os.WriteFile(out, wasm, 0o644); err != nil {
			return err
		}
		fmt.Printf("%s: %d bytes\n", out, len(wasm))
		return nil
	}
	st, err := wasmbuild.BuildStages(pkg, tags...)
	if err != nil {
		return err
	}
	s, err := wasmbuild.MeasureSizes(st.Linked)
	if err != nil {
		return err
	}
	fmt.Printf("Go toolchain: %d bytes; WASI shim linked: %d bytes; jumps threaded: %d bytes; optimized (shipped): %d bytes\n\n",
		len(st.Toolchain), len(st.Linked), len(st.Threaded), len(st.Optimized))
	fmt.Println("Before the optimizer:")
	s.Table(os.Stdout, top, funcs)
	if out != "" {
		if err := os.WriteFile(out, st.Optimized, 0o644); err != nil {
			return err
		}
		fmt.Printf("\n%s: %d bytes\n", out, len(st.Optimized))
	}
	return nil
}

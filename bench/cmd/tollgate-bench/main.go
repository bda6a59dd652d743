package main

import (
	"fmt"
	"os"

	"github.com/tollgate-rl/tollgate/bench/perf"
)

func main() {
	for _, m := range []struct{ name, pkg string; cfg []byte }{{"empty", perf.EmptyPkg, nil}, {"floor", perf.FloorPkg, nil}, {"filter", perf.FilterPkg, perf.LocalRuleConfig}} {
		w, err := perf.BuildModule(m.pkg)
		if err != nil { fmt.Println(err); os.Exit(1) }
		c, err := perf.MeasureCost(m.name, w, m.cfg, perf.CostOptions{})
		if err != nil { fmt.Println(err); os.Exit(1) }
		fmt.Printf("%+v\n", c)
	}
}

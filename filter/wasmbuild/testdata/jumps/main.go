// Command jumps exercises the control flow Thread rewrites — forward jumps of every
// kind (if/else chains, switches, bounds checks, early returns, panics), loops (the
// backward jumps it leaves) — and the resumptions it must not disturb: goroutines
// switching on channels, a panic recovered through deferred calls, garbage
// collections. It prints one line per part; run natively, unthreaded and threaded,
// the output must be the same.
package main

import (
	"fmt"
	"runtime"
	"sort"
	"strconv"
	"strings"
)

func classify(n int) string {
	switch {
	case n < 0:
		return "neg"
	case n == 0:
		return "zero"
	case n%15 == 0:
		return "fizzbuzz"
	case n%5 == 0:
		return "buzz"
	case n%3 == 0:
		return "fizz"
	}
	if n > 1000 {
		return "big"
	}
	return strconv.Itoa(n)
}

func collatz(n uint64) (steps int) {
	for n != 1 {
		if n&1 == 0 {
			n /= 2
		} else {
			n = 3*n + 1
		}
		steps++
	}
	return steps
}

func index(xs []int, i int) (v int, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("recovered: %v", r)
		}
	}()
	return xs[i], nil
}

func producer(n int, out chan<- int) {
	for i := 0; i < n; i++ {
		out <- i * i
		if i%7 == 0 {
			runtime.Gosched()
		}
	}
	close(out)
}

func main() {
	var b strings.Builder
	for i := -2; i < 40; i++ {
		b.WriteString(classify(i))
		b.WriteByte(' ')
	}
	fmt.Println(b.String())

	total := 0
	for i := uint64(1); i < 3000; i++ {
		total += collatz(i)
	}
	fmt.Println("collatz", total)

	xs := []int{4, 8, 15, 16, 23, 42}
	for _, i := range []int{0, 5, 6, -1} {
		v, err := index(xs, i)
		fmt.Println("index", i, v, err)
	}

	chans := make([]chan int, 4)
	for i := range chans {
		chans[i] = make(chan int)
		go producer(50+i*10, chans[i])
	}
	sums := make([]int, len(chans))
	for i, c := range chans {
		for v := range c {
			sums[i] += v
		}
	}
	fmt.Println("goroutines", sums)

	m := map[string][]int{}
	for i := 0; i < 20000; i++ {
		k := "k" + strconv.Itoa(i%97)
		m[k] = append(m[k], i)
		if i%5000 == 0 {
			runtime.GC()
		}
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Println("map", len(keys), keys[:3], len(m["k13"]), m["k96"][len(m["k96"])-1])
}

package wasmbuild

import (
	"cmp"
	"slices"
)

// restructureLoops gives the innermost loops their own wasm loop, so that a back edge
// is a branch to it rather than a trip through the dispatch. A loop whose header is
// block hi's code and whose last back edge comes from block lo's (hi >= lo: blocks
// with smaller indices end later) becomes
//
//	end(hi) loop L' block B'(lo) … block B'(hi-1) block E
//	        local.get 0; i32.const K; i32.eq; br_if E   ;; the back edge's state
//	        local.get 0; br_table <states of lo..hi-1 to their B', others to E>
//	      end(E) code(hi) end(B'(hi-1)) code(hi-1) … end(B'(lo)) code(lo)
//	end(L')
//
// and the original blocks lo..hi-1 go: the outer dispatch sends their states to hi's
// block, from which the inner dispatch finds them (a frame resumed inside the loop,
// after a goroutine switch), and a jump into them from outside the loop goes back to
// the dispatch. Falling into L' from code before it, PC_B holds a state no later than
// hi's (every jump sets it to its target, and states follow code order), which the
// inner dispatch sends to E: hi's code, as before.
func (f *code) restructureLoops(d dispatch, st *ThreadStats) {
	region := make([]int, len(f.ins)) // of each instruction, found once
	for i := range f.ins {
		region[i] = d.region(i)
	}
	type edge struct{ at, k, from int }
	var back []edge
	lo := map[int]int{}
	for i := range f.ins {
		k, ok := f.dispatched(d, i)
		if !ok {
			continue
		}
		from, hi := region[i], d.state[k]
		if from < 0 || from > hi {
			return // not a back edge of the dispatch's code: leave the function as is
		}
		back = append(back, edge{i, k, from})
		if v, ok := lo[hi]; !ok || from < v {
			lo[hi] = from
		}
	}
	type span struct{ lo, hi int }
	var cands []span
	for hi, l := range lo {
		cands = append(cands, span{l, hi})
	}
	slices.SortFunc(cands, func(a, b span) int { return cmp.Compare(a.hi, b.hi) })
	var loops []span
	for _, c := range cands {
		ok := true
		for _, o := range cands {
			if o == c {
				continue
			}
			inside := o.lo >= c.lo && o.hi <= c.hi
			within := c.lo >= o.lo && c.hi <= o.hi
			overlap := o.lo <= c.hi && c.lo <= o.hi
			if inside || (overlap && !within) {
				ok = false
				break
			}
		}
		if ok {
			loops = append(loops, c)
		}
	}
	if len(loops) == 0 {
		return
	}

	saved, savedStats := slices.Clone(f.ins), *st
	for i := range saved {
		saved[i].targets = slices.Clone(saved[i].targets)
	}
	drop := map[int]bool{}                                // instructions removed: the moved blocks' openers
	after, before := map[int][]instr{}, map[int][]instr{} // instructions inserted around an index
	for _, l := range loops {
		loop := f.labels
		f.labels++
		inner := make(map[int]int) // block index in lo..hi-1 -> its B' label
		var open []instr
		open = append(open, instr{op: opLoop, raw: rawEmptyLoop, label: loop, k: -1})
		for b := l.lo; b < l.hi; b++ {
			inner[b] = f.labels
			open = append(open, instr{op: opBlock, raw: rawEmptyBlock, label: f.labels, k: -1})
			f.labels++
			drop[d.at+1+b] = true
		}
		var headK int
		for _, e := range back {
			if d.state[e.k] == l.hi && e.from >= l.lo {
				headK = e.k
				break
			}
		}
		if len(inner) > 0 {
			entry := f.labels
			f.labels++
			table := instr{op: opBrTable, k: -1}
			last := 0
			for s, b := range d.state {
				if _, ok := inner[b]; ok {
					last = s
				}
			}
			for s := 0; s <= last; s++ {
				t, ok := inner[d.state[s]]
				if !ok {
					t = entry
				}
				table.targets = append(table.targets, t)
			}
			table.targets = append(table.targets, entry)
			open = append(open,
				instr{op: opBlock, raw: rawEmptyBlock, label: entry, k: -1},
				instr{op: opLocalGet, raw: rawGetPC, k: -1},
				instr{op: opI32Const, raw: appendSleb([]byte{opI32Const}, int64(headK)), k: int64(headK)},
				instr{op: opI32Eq, raw: rawI32Eq, k: -1},
				instr{op: opBrIf, targets: []int{entry}, k: -1},
				instr{op: opLocalGet, raw: rawGetPC, k: -1},
				table,
				instr{op: opEnd, raw: rawEnd, k: -1})
		}
		after[d.end[l.hi]] = append(after[d.end[l.hi]], open...)
		closeAt := d.loopEnd
		if l.lo > 0 {
			closeAt = d.end[l.lo-1]
		}
		before[closeAt] = append(before[closeAt], instr{op: opEnd, raw: rawEnd, k: -1})

		for i := range f.ins {
			in := &f.ins[i]
			inLoop := region[i] >= l.lo && region[i] <= l.hi
			for j, t := range in.targets {
				b, ok := d.blockOf[t]
				if !ok || b < l.lo || b >= l.hi {
					continue
				}
				switch {
				case i == d.table:
					in.targets[j] = d.blocks[l.hi]
				case inLoop:
					in.targets[j] = inner[b]
				default: // a jump into the loop's body from outside: through the dispatch
					if _, ok := f.jumpTo(i, t, len(d.state)); !ok {
						f.ins, *st = saved, savedStats
						st.Skipped++
						return
					}
					in.targets[j] = d.loop
					st.Threaded--
					st.Backward++
				}
			}
		}
		for _, e := range back {
			if d.state[e.k] == l.hi && e.from >= l.lo {
				f.ins[e.at].targets[0] = loop
				st.Backward--
				st.Looped++
			}
		}
	}
	var out []instr
	for i, in := range f.ins {
		out = append(out, before[i]...)
		if !drop[i] {
			out = append(out, in)
		}
		out = append(out, after[i]...)
	}
	f.ins = out
	if _, err := f.encode(nil); err != nil {
		f.ins, *st = saved, savedStats
		st.Skipped++
		return
	}
	st.Loops += len(loops)
}

package wasmbuild

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
)

// Go's wasm backend compiles every function that can be suspended (any function that
// calls another) into a resumable state machine: the body is a loop around a chain of
// nested blocks whose innermost instruction is a br_table on the function's first
// parameter, the resume point (PC_B). Each basic block's code follows the end of "its"
// block, and every jump between basic blocks, forward or back, is emitted as
//
//	i32.const K; local.set 0; br $loop
//
// — back to the loop, through the br_table, to block K. The dispatch is an indirect
// jump, and every such edge also makes the loop header a merge point of the whole
// function's values, which a Wasm engine's register allocator pays for everywhere.
//
// A forward jump does not need the loop: the block whose end is where K's code starts
// still encloses the jump (blocks of later states enclose the code of earlier ones), so
// `br` to that block lands in the same place, directly. Thread rewrites exactly those
// jumps and nothing else: the resume point is still set (a later dispatch, after a
// goroutine switch, reads it), backward jumps still go through the loop, and so do
// entries and resumptions. No Go toolchain option does this (cmd/internal/obj/wasm
// always emits the dispatch), and binaryen's optimizer keeps the pattern, as it cannot
// see through the local; hence this pass.

// ThreadStats counts what Thread did.
type ThreadStats struct {
	Funcs    int // function bodies with the resumable shape
	Threaded int // forward jumps now direct branches
	Loops    int // loops given their own wasm loop
	Looped   int // back edges now branches to such a loop
	Backward int // jumps left to the dispatch
	Skipped  int // functions whose loops could not be rewritten (left forward-threaded)
}

// Thread returns wasm with the forward jumps of Go's resumable functions taken
// directly (see above). Functions of any other shape are copied unchanged.
func Thread(wasm []byte) ([]byte, ThreadStats, error) {
	var st ThreadStats
	secs, err := splitSections(wasm)
	if err != nil {
		return nil, st, err
	}
	for i, s := range secs {
		if s.id != secCode {
			continue
		}
		bodies, err := readVec(s.body, readSized)
		if err != nil {
			return nil, st, fmt.Errorf("code section: %w", err)
		}
		out := make([][]byte, len(bodies))
		for j, entry := range bodies {
			r := reader{b: entry}
			body := r.bytes(int(r.u32()))
			if r.err != nil {
				return nil, st, fmt.Errorf("function body %d: %w", j, r.err)
			}
			if out[j], err = threadBody(body, &st); err != nil {
				return nil, st, fmt.Errorf("function body %d: %w", j, err)
			}
		}
		secs[i].body = writeVec(sized(out))
	}
	return joinSections(secs), st, nil
}

// threadBody returns one function body (locals and code, without its size) threaded.
func threadBody(body []byte, st *ThreadStats) ([]byte, error) {
	r := reader{b: body}
	groups := r.u32()
	for i := uint32(0); i < groups && r.err == nil; i++ {
		r.u32()
		r.byte()
	}
	if r.err != nil {
		return nil, fmt.Errorf("locals: %w", r.err)
	}
	code := body[r.p:]
	f, err := decodeCode(code)
	if err != nil {
		return nil, err
	}
	d, ok := f.dispatch()
	if !ok {
		return body, nil
	}
	st.Funcs++
	f.threadForward(d, st)
	loops := f.restructureLoops(d, st)
	f.enterDirectly()
	out, err := f.encode(body[:r.p])
	if err != nil && loops > 0 {
		return nil, fmt.Errorf("loops: %w", err)
	}
	return out, err
}

// A function's code as instructions, with every branch target and every construct
// named by a label id (0: the function body) instead of a relative depth, so that
// constructs can be added and moved and depths computed again when encoding.
type code struct {
	ins    []instr
	labels int // ids handed out
}

type instr struct {
	op      byte
	raw     []byte // the whole instruction as read (openers: with their block type)
	label   int    // block, loop, if: the label it opens
	targets []int  // br, br_if: one label; br_table: every entry, the default last
	k       int64  // i32.const: its value; -1 for other instructions
}

const (
	opBlock, opLoop, opIf, opElse, opEnd = 0x02, 0x03, 0x04, 0x05, 0x0B
	opBr, opBrIf, opBrTable              = 0x0C, 0x0D, 0x0E
	opLocalGet, opLocalSet, opI32Const   = 0x20, 0x21, 0x41
	opI32Eqz, opI32Eq                    = 0x45, 0x46
)

func decodeCode(b []byte) (*code, error) {
	f := &code{labels: 1}
	stack := []int{0}
	c := reader{b: b}
	for !c.done() {
		start := c.p
		op := c.byte()
		in := instr{op: op, k: -1}
		target := func(depth uint32) int {
			if int(depth) >= len(stack) {
				c.fail(fmt.Errorf("branch depth %d outside %d labels", depth, len(stack)))
				return 0
			}
			return stack[len(stack)-1-int(depth)]
		}
		switch op {
		case opBr, opBrIf:
			in.targets = []int{target(c.u32())}
		case opBrTable:
			n := c.u32()
			if n > uint32(len(b)) {
				return nil, fmt.Errorf("br_table of %d entries", n)
			}
			for i := uint32(0); i <= n && c.err == nil; i++ {
				in.targets = append(in.targets, target(c.u32()))
			}
		default:
			if err := skipImmediates(&c, op, start); err != nil {
				return nil, err
			}
		}
		switch op {
		case opBlock, opLoop, opIf:
			in.label = f.labels
			f.labels++
			stack = append(stack, in.label)
		case opEnd:
			if len(stack) == 0 {
				return nil, fmt.Errorf("end without construct at byte %d", start)
			}
			stack = stack[:len(stack)-1]
		case opI32Const:
			v := reader{b: b[start+1 : c.p]}
			in.k = v.s33()
		}
		if c.err != nil {
			return nil, c.err
		}
		in.raw = b[start:c.p]
		f.ins = append(f.ins, in)
	}
	return f, c.err
}

// encode writes the locals and the instructions, branch depths computed from labels.
func (f *code) encode(locals []byte) ([]byte, error) {
	out := append(make([]byte, 0, len(locals)+8*len(f.ins)), locals...)
	stack := []int{0}
	depth := func(label int) (uint64, error) {
		for k := len(stack) - 1; k >= 0; k-- {
			if stack[k] == label {
				return uint64(len(stack) - 1 - k), nil
			}
		}
		return 0, fmt.Errorf("branch to label %d, which does not enclose it", label)
	}
	for _, in := range f.ins {
		switch in.op {
		case opBr, opBrIf, opBrTable:
			out = append(out, in.op)
			if in.op == opBrTable {
				out = binary.AppendUvarint(out, uint64(len(in.targets)-1))
			}
			for _, t := range in.targets {
				d, err := depth(t)
				if err != nil {
					return nil, err
				}
				out = binary.AppendUvarint(out, d)
			}
			continue
		case opBlock, opLoop, opIf:
			stack = append(stack, in.label)
		case opEnd:
			if len(stack) == 0 {
				return nil, fmt.Errorf("unbalanced end")
			}
			stack = stack[:len(stack)-1]
		}
		out = append(out, in.raw...)
	}
	if len(stack) != 0 {
		return nil, fmt.Errorf("%d constructs left open", len(stack))
	}
	return out, nil
}

// dispatch is where a resumable function's state machine sits.
type dispatch struct {
	loop    int   // the loop's label
	at      int   // index of the loop's opener
	blocks  []int // the nested blocks' labels, outermost first
	table   int   // index of the br_table
	state   []int // state K -> the block (index in blocks) whose end K's code follows
	end     []int // block (index in blocks) -> index of its end
	loopEnd int   // index of the loop's end
}

var (
	rawEmptyBlock = []byte{opBlock, 0x40}
	rawEmptyLoop  = []byte{opLoop, 0x40}
	rawEnd        = []byte{opEnd}
	rawGetPC      = []byte{opLocalGet, 0}
	rawI32Eq      = []byte{opI32Eq}
	rawI32Eqz     = []byte{opI32Eqz}
)

// dispatch recognises Go's prologue: the function's first loop, whose body opens only
// empty-typed blocks, then `local.get 0; br_table` with every target one of those
// blocks and the states in the order of the blocks' ends (each state's code follows
// the earlier ones').
func (f *code) dispatch() (dispatch, bool) {
	var d dispatch
	d.at = -1
	for i, in := range f.ins {
		if in.op == opLoop {
			d.at = i
			break
		}
	}
	if d.at < 0 || !bytes.Equal(f.ins[d.at].raw, rawEmptyLoop) {
		return d, false
	}
	d.loop = f.ins[d.at].label
	i := d.at + 1
	for ; i < len(f.ins) && bytes.Equal(f.ins[i].raw, rawEmptyBlock); i++ {
		d.blocks = append(d.blocks, f.ins[i].label)
	}
	if len(d.blocks) == 0 || i+1 >= len(f.ins) || !bytes.Equal(f.ins[i].raw, rawGetPC) || f.ins[i+1].op != opBrTable {
		return d, false
	}
	d.table = i + 1
	index := make(map[int]int, len(d.blocks))
	for b, l := range d.blocks {
		index[l] = b
	}
	targets := f.ins[d.table].targets
	for _, t := range targets[:len(targets)-1] {
		b, ok := index[t]
		if !ok || (len(d.state) > 0 && b > d.state[len(d.state)-1]) {
			return d, false
		}
		d.state = append(d.state, b)
	}
	if _, ok := index[targets[len(targets)-1]]; !ok {
		return d, false
	}
	// The ends: the innermost block's first, the loop's after the outermost's.
	d.end = make([]int, len(d.blocks))
	depth, next := 0, len(d.blocks)-1
	for j := d.table + 1; j < len(f.ins); j++ {
		switch f.ins[j].op {
		case opBlock, opLoop, opIf:
			depth++
		case opEnd:
			if depth > 0 {
				depth--
				continue
			}
			if next < 0 {
				d.loopEnd = j
				return d, true
			}
			d.end[next] = j
			next--
		}
	}
	return d, false
}

// region is the dispatch block whose end precedes instruction i (-1 before the first
// end or after the loop's), as an index in d.blocks.
func (d *dispatch) region(i int) int {
	if i <= d.end[len(d.blocks)-1] || i >= d.loopEnd {
		return -1
	}
	for b := 0; b < len(d.blocks); b++ {
		if i > d.end[b] {
			return b
		}
	}
	return -1
}

// dispatched reports whether instruction i is `br <dispatch loop>` after
// `i32.const K; local.set 0`, and returns K.
func (f *code) dispatched(d dispatch, i int) (int, bool) {
	in := f.ins[i]
	if in.op != opBr || in.targets[0] != d.loop || i < 2 {
		return 0, false
	}
	set, k := f.ins[i-1], f.ins[i-2]
	if !bytes.Equal(set.raw, []byte{opLocalSet, 0}) || k.op != opI32Const || k.k < 0 || k.k >= int64(len(d.state)) {
		return 0, false
	}
	return int(k.k), true
}

// threadForward points every dispatched jump whose target block encloses it at that
// block.
func (f *code) threadForward(d dispatch, st *ThreadStats) {
	for i := range f.ins {
		k, ok := f.dispatched(d, i)
		if !ok {
			continue
		}
		if b := d.state[k]; i < d.end[b] {
			f.ins[i].targets[0] = d.blocks[b]
			st.Threaded++
		} else {
			st.Backward++
		}
	}
}

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
// inner dispatch sends to E: hi's code, as before. It returns the loops rewritten.
func (f *code) restructureLoops(d dispatch, st *ThreadStats) int {
	type edge struct{ at, k, from int }
	var back []edge
	lo := map[int]int{}
	for i := range f.ins {
		k, ok := f.dispatched(d, i)
		if !ok {
			continue
		}
		from, hi := d.region(i), d.state[k]
		if from < 0 || from > hi {
			return 0 // not a back edge of the dispatch's code: leave the function as is
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
		return 0
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
			r := d.region(i)
			inLoop := r >= l.lo && r <= l.hi
			for j, t := range in.targets {
				b := slices.Index(d.blocks, t)
				if b < l.lo || b >= l.hi {
					continue
				}
				switch {
				case i == d.table:
					in.targets[j] = d.blocks[l.hi]
				case inLoop:
					in.targets[j] = inner[b]
				default: // a jump into the loop's body from outside: through the dispatch
					if _, ok := f.dispatched(dispatch{loop: t, state: d.state}, i); !ok {
						f.ins, *st = saved, savedStats
						st.Skipped++
						return 0
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
		return 0
	}
	st.Loops += len(loops)
	return len(loops)
}

// enterDirectly tests for state 0 — a call, as opposed to a resumption — before the
// dispatch and branches to its block directly: every call enters its function through
// the dispatch, and a conditional branch that is nearly always taken costs less than
// the indirect jump.
func (f *code) enterDirectly() {
	for i, in := range f.ins {
		if in.op == opLoop {
			for j := i + 1; j < len(f.ins) && f.ins[j].op == opBlock; j++ {
				if j+2 < len(f.ins) && bytes.Equal(f.ins[j+1].raw, rawGetPC) && f.ins[j+2].op == opBrTable {
					at := j + 1
					f.ins = slices.Insert(f.ins, at,
						instr{op: opLocalGet, raw: rawGetPC, k: -1},
						instr{op: opI32Eqz, raw: rawI32Eqz, k: -1},
						instr{op: opBrIf, targets: []int{f.ins[at+1].targets[0]}, k: -1})
					return
				}
			}
			return
		}
	}
}

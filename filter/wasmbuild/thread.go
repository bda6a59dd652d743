package wasmbuild

import (
	"bytes"
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
// Thread takes those jumps without the dispatch where the structure allows it:
//
//   - A forward jump does not need the loop: the block whose end is where K's code
//     starts still encloses the jump (blocks of later states enclose the code of
//     earlier ones), so `br` to that block lands in the same place, directly.
//   - A back edge of an innermost loop branches to a wasm loop of its own around the
//     loop's code (restructureLoops says how, and how a frame resumed inside it is
//     still found).
//   - A call enters its function's first block directly after testing for state 0;
//     only a resumption takes the indirect jump.
//
// The resume point is still set before every jump (a later dispatch, after a goroutine
// switch, reads it); resumption and unwinding are untouched. No Go toolchain option
// does this (cmd/internal/obj/wasm always emits the dispatch), and binaryen's optimizer
// keeps the pattern, as it cannot see through the local; hence this pass.

// ThreadStats counts what Thread did.
type ThreadStats struct {
	Funcs    int // function bodies with the resumable shape
	Threaded int // forward jumps now direct branches
	Loops    int // loops given their own wasm loop
	Looped   int // back edges now branches to such a loop
	Backward int // jumps left to the dispatch
	Skipped  int // functions whose loops could not be rewritten (left forward-threaded)
}

// Thread returns wasm with the jumps of Go's resumable functions taken directly where
// it can (see above). Functions of any other shape are copied unchanged.
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
	at, err := codeStart(body)
	if err != nil {
		return nil, err
	}
	f, err := decodeCode(body[at:])
	if err != nil {
		return nil, err
	}
	d, ok := f.dispatch()
	if !ok {
		return body, nil
	}
	st.Funcs++
	f.threadForward(d, st)
	f.restructureLoops(d, st)
	f.enterDirectly()
	return f.encode(body[:at])
}

// dispatch is where a resumable function's state machine sits.
type dispatch struct {
	loop    int         // the loop's label
	at      int         // index of the loop's opener
	blocks  []int       // the nested blocks' labels, outermost first
	blockOf map[int]int // a block's label -> its index in blocks
	table   int         // index of the br_table
	state   []int       // state K -> the block (index in blocks) whose end K's code follows
	end     []int       // block (index in blocks) -> index of its end
	loopEnd int         // index of the loop's end
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
	d.blockOf = make(map[int]int, len(d.blocks))
	for b, l := range d.blocks {
		d.blockOf[l] = b
	}
	targets := f.ins[d.table].targets
	for _, t := range targets[:len(targets)-1] {
		b, ok := d.blockOf[t]
		if !ok || (len(d.state) > 0 && b > d.state[len(d.state)-1]) {
			return d, false
		}
		d.state = append(d.state, b)
	}
	if _, ok := d.blockOf[targets[len(targets)-1]]; !ok {
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
	return f.jumpTo(i, d.loop, len(d.state))
}

// jumpTo reports whether instruction i is `br <label>` after `i32.const K; local.set 0`
// with K below states, and returns K.
func (f *code) jumpTo(i, label, states int) (int, bool) {
	in := f.ins[i]
	if in.op != opBr || in.targets[0] != label || i < 2 {
		return 0, false
	}
	set, k := f.ins[i-1], f.ins[i-2]
	if !bytes.Equal(set.raw, []byte{opLocalSet, 0}) || k.op != opI32Const || k.k < 0 || k.k >= int64(states) {
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

// enterDirectly tests for state 0 — a call, as opposed to a resumption — before the
// dispatch and branches to its block directly: every call enters its function through
// the dispatch, and a conditional branch that is nearly always taken costs less than
// the indirect jump. The dispatch's br_table is the function's first (dispatch checked
// the prologue; restructureLoops only removes blocks from it and adds tables after it).
func (f *code) enterDirectly() {
	at := slices.IndexFunc(f.ins, func(in instr) bool { return in.op == opBrTable }) - 1
	f.ins = slices.Insert(f.ins, at,
		instr{op: opLocalGet, raw: rawGetPC, k: -1},
		instr{op: opI32Eqz, raw: rawI32Eqz, k: -1},
		instr{op: opBrIf, targets: []int{f.ins[at+1].targets[0]}, k: -1})
}

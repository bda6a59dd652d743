package wasmbuild

import (
	"encoding/binary"
	"fmt"
)

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

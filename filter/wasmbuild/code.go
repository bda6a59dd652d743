package wasmbuild

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// rewriteExpr copies a function body's instruction sequence (after the locals) from in to
// out, passing the immediate of every instruction that names a function (call, ref.func)
// through fn and every type index (call_indirect, block types) through typ. It knows the
// instructions of WebAssembly 1.0 plus sign extension, saturating conversions, bulk
// memory and reference types — what Go's wasm backend emits — and refuses anything
// else rather than copy bytes it cannot account for.
func rewriteExpr(in []byte, fn, typ func(uint32) (uint32, error)) ([]byte, error) {
	out := make([]byte, 0, len(in)+8)
	r := reader{b: in}
	for !r.done() {
		start := r.p
		op := r.byte()
		switch {
		case op == 0x10 || op == 0xD2: // call f, ref.func f
			idx := r.u32()
			if r.err != nil {
				return nil, r.err
			}
			n, err := fn(idx)
			if err != nil {
				return nil, err
			}
			out = append(out, op)
			out = binary.AppendUvarint(out, uint64(n))
			continue
		case op == 0x11: // call_indirect type table
			idx := r.u32()
			table := r.u32()
			if r.err != nil {
				return nil, r.err
			}
			n, err := typ(idx)
			if err != nil {
				return nil, err
			}
			out = append(out, op)
			out = binary.AppendUvarint(out, uint64(n))
			out = binary.AppendUvarint(out, uint64(table))
			continue
		case op == 0x02 || op == 0x03 || op == 0x04: // block, loop, if: blocktype
			if r.p < len(r.b) && (r.b[r.p] == 0x40 || isValType(r.b[r.p])) {
				r.p++
				break
			}
			idx := r.s33()
			if r.err != nil {
				return nil, r.err
			}
			if idx < 0 {
				return nil, fmt.Errorf("block type %d at byte %d", idx, start)
			}
			n, err := typ(uint32(idx))
			if err != nil {
				return nil, err
			}
			out = append(out, op)
			out = appendSleb(out, int64(n))
			continue
		default:
			if err := skipImmediates(&r, op, start); err != nil {
				return nil, err
			}
		}
		if r.err != nil {
			return nil, r.err
		}
		out = append(out, in[start:r.p]...)
	}
	return out, r.err
}

// skipImmediates advances r over the immediates of the instruction op that starts at
// byte start, for every instruction Go's wasm backend emits (see rewriteExpr), and
// refuses any other.
func skipImmediates(r *reader, op byte, start int) error {
	switch {
	case op == 0x10 || op == 0xD2: // call f, ref.func f
		r.u32()
	case op == 0x11: // call_indirect type table
		r.u32()
		r.u32()
	case op == 0x02 || op == 0x03 || op == 0x04: // block, loop, if: blocktype
		if r.p < len(r.b) && (r.b[r.p] == 0x40 || isValType(r.b[r.p])) {
			r.p++
		} else if r.s33() < 0 && r.err == nil {
			return fmt.Errorf("block type at byte %d", start)
		}
	case op == 0x00 || op == 0x01 || op == 0x05 || op == 0x0B || op == 0x0F ||
		op == 0x1A || op == 0x1B || op == 0xD1 || (op >= 0x45 && op <= 0xC4):
		// no immediate
	case op == 0x0C || op == 0x0D || (op >= 0x20 && op <= 0x26): // br, br_if, locals, globals, table.get/set
		r.u32()
	case op == 0x0E: // br_table
		n := r.u32()
		for i := uint32(0); i <= n && r.err == nil; i++ {
			r.u32()
		}
	case op == 0x1C: // select t*
		n := r.u32()
		for i := uint32(0); i < n && r.err == nil; i++ {
			r.byte()
		}
	case op >= 0x28 && op <= 0x3E: // loads and stores: align, offset
		r.u32()
		r.u32()
	case op == 0x3F || op == 0x40: // memory.size, memory.grow
		r.byte()
	case op == 0x41:
		r.s33() // i32.const: a 32-bit signed LEB fits the 33-bit reader
	case op == 0x42:
		r.s64()
	case op == 0x43:
		r.skip(4)
	case op == 0x44:
		r.skip(8)
	case op == 0xD0: // ref.null t
		r.byte()
	case op == 0xFC:
		switch sub := r.u32(); {
		case sub <= 7: // saturating truncations
		case sub == 8: // memory.init data mem
			r.u32()
			r.byte()
		case sub == 9, sub == 13, sub >= 15 && sub <= 17: // data.drop, elem.drop, table.grow/size/fill
			r.u32()
		case sub == 10: // memory.copy
			r.byte()
			r.byte()
		case sub == 11: // memory.fill
			r.byte()
		case sub == 12, sub == 14: // table.init, table.copy
			r.u32()
			r.u32()
		default:
			return fmt.Errorf("unknown instruction 0xFC %d at byte %d", sub, start)
		}
	default:
		return fmt.Errorf("unknown instruction 0x%02X at byte %d", op, start)
	}
	return r.err
}

// codeStart returns where a function body's instructions start: after its locals.
func codeStart(body []byte) (int, error) {
	r := reader{b: body}
	groups := r.u32()
	for i := uint32(0); i < groups && r.err == nil; i++ {
		r.u32()
		r.byte()
	}
	if r.err != nil {
		return 0, fmt.Errorf("locals: %w", r.err)
	}
	return r.p, nil
}

func isValType(b byte) bool {
	switch b {
	case 0x7F, 0x7E, 0x7D, 0x7C, 0x7B, 0x70, 0x6F:
		return true
	}
	return false
}

var errTruncated = errors.New("truncated")

// reader decodes the binary format's integers; the first error sticks.
type reader struct {
	b   []byte
	p   int
	err error
}

func (r *reader) done() bool { return r.err != nil || r.p >= len(r.b) }

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = fmt.Errorf("byte %d: %w", r.p, err)
	}
	r.p = len(r.b)
}

func (r *reader) byte() byte {
	if r.p >= len(r.b) {
		r.fail(errTruncated)
		return 0
	}
	r.p++
	return r.b[r.p-1]
}

func (r *reader) skip(n int) {
	if n < 0 || len(r.b)-r.p < n {
		r.fail(errTruncated)
		return
	}
	r.p += n
}

func (r *reader) bytes(n int) []byte {
	start := r.p
	r.skip(n)
	if r.err != nil {
		return nil
	}
	return r.b[start:r.p]
}

func (r *reader) u32() uint32 {
	v, n := binary.Uvarint(r.b[min(r.p, len(r.b)):])
	if n <= 0 || n > 5 || v > 1<<32-1 {
		r.fail(errors.New("bad u32"))
		return 0
	}
	r.p += n
	return uint32(v)
}

func (r *reader) name() string {
	n := r.u32()
	return string(r.bytes(int(n)))
}

// s33 reads a signed LEB128 of at most 33 bits (block types, i32.const).
func (r *reader) s33() int64 { return r.sleb(5) }

func (r *reader) s64() int64 { return r.sleb(10) }

func (r *reader) sleb(max int) int64 {
	var v int64
	var shift uint
	for i := 0; i < max; i++ {
		b := r.byte()
		if r.err != nil {
			return 0
		}
		v |= int64(b&0x7F) << shift
		shift += 7
		if b&0x80 == 0 {
			if shift < 64 && b&0x40 != 0 {
				v |= -1 << shift
			}
			return v
		}
	}
	r.fail(errors.New("signed LEB128 too long"))
	return 0
}

func appendSleb(b []byte, v int64) []byte {
	for {
		c := byte(v & 0x7F)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

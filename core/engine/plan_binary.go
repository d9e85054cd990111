package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/kvslab"
)

// The BatchPlan binary encoding, version 1, little endian throughout:
//
//	magic "RSNP" | version u16 | reserved u16 (0)
//	Step u64 | GraphBatch i32 | B u32 | T u32 | L u32 | G u32
//	per sequence (B each): ReqIDs u64, Computed i32, Scheduled i32, PromptLen i32,
//	  NumDrafts i32, Temperature f32, TopP f32, TopK i32, MinP f32, Seed u64, Logprobs i32
//	QueryStart (B+1) i32 | LogitsStart (B+1) i32
//	Tokens (T) i32 | Positions (T) i32 | LogitsIndices (L) i32
//	per group: P u32 | S u32 | SlotMapping (T) i64 | PageTableStart (B+1) i32 |
//	  PageTable (P) u32 | StatePage (S) u32
//
// A decoder rejects other versions, a non-zero reserved field, trailing bytes and any plan
// that fails Validate.

const (
	planMagic   = "RSNP"
	planVersion = 1
	headerBytes = 4 + 2 + 2 + 8 + 4 + 4*4
	maxGroups   = 1 << 10
)

// ErrPlanEncoding is wrapped by every UnmarshalBinary error.
var ErrPlanEncoding = errors.New("engine: malformed BatchPlan encoding")

// MarshalBinary encodes the plan (implements encoding.BinaryMarshaler).
func (p *BatchPlan) MarshalBinary() ([]byte, error) {
	return p.AppendBinary(make([]byte, 0, p.encodedLen()))
}

func (p *BatchPlan) encodedLen() int {
	b, t := len(p.ReqIDs), len(p.Tokens)
	n := headerBytes + b*52 + 2*4*(b+1) + 8*t + 4*len(p.LogitsIndices)
	for g := range p.Groups {
		gp := &p.Groups[g]
		n += 8 + 8*t + 4*(b+1) + 4*len(gp.PageTable) + 4*len(gp.StatePage)
	}
	return n
}

// AppendBinary appends the plan's encoding to dst (implements encoding.BinaryAppender);
// with a large enough dst it allocates nothing.
func (p *BatchPlan) AppendBinary(dst []byte) ([]byte, error) {
	if err := p.Validate(); err != nil {
		return dst, err
	}
	le := binary.LittleEndian
	dst = append(dst, planMagic...)
	dst = le.AppendUint16(dst, planVersion)
	dst = le.AppendUint16(dst, 0)
	dst = le.AppendUint64(dst, p.Step)
	dst = le.AppendUint32(dst, uint32(p.GraphBatch))
	for _, n := range []int{len(p.ReqIDs), len(p.Tokens), len(p.LogitsIndices), len(p.Groups)} {
		dst = le.AppendUint32(dst, uint32(n))
	}
	for _, v := range p.ReqIDs {
		dst = le.AppendUint64(dst, v)
	}
	dst = appendI32(dst, p.Computed)
	dst = appendI32(dst, p.Scheduled)
	dst = appendI32(dst, p.PromptLen)
	dst = appendI32(dst, p.NumDrafts)
	dst = appendF32(dst, p.Temperature)
	dst = appendF32(dst, p.TopP)
	dst = appendI32(dst, p.TopK)
	dst = appendF32(dst, p.MinP)
	for _, v := range p.Seed {
		dst = le.AppendUint64(dst, v)
	}
	dst = appendI32(dst, p.Logprobs)
	dst = appendI32(dst, p.QueryStart)
	dst = appendI32(dst, p.LogitsStart)
	dst = appendI32(dst, p.Tokens)
	dst = appendI32(dst, p.Positions)
	dst = appendI32(dst, p.LogitsIndices)
	for g := range p.Groups {
		gp := &p.Groups[g]
		dst = le.AppendUint32(dst, uint32(len(gp.PageTable)))
		dst = le.AppendUint32(dst, uint32(len(gp.StatePage)))
		for _, v := range gp.SlotMapping {
			dst = le.AppendUint64(dst, uint64(v))
		}
		dst = appendI32(dst, gp.PageTableStart)
		for _, v := range gp.PageTable {
			dst = le.AppendUint32(dst, uint32(v))
		}
		for _, v := range gp.StatePage {
			dst = le.AppendUint32(dst, uint32(v))
		}
	}
	return dst, nil
}

func appendI32(dst []byte, s []int32) []byte {
	for _, v := range s {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(v))
	}
	return dst
}

func appendF32(dst []byte, s []float32) []byte {
	for _, v := range s {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
	}
	return dst
}

// reader decodes fixed-width little-endian values, remembering the first shortfall.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.err = fmt.Errorf("%w: need %d bytes, %d left", ErrPlanEncoding, n, len(r.b))
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) u16() uint16 {
	if b := r.take(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (r *reader) i32s(dst []int32, n int) []int32 {
	b := r.take(4 * n)
	dst = dst[:0]
	for i := 0; b != nil && i < n; i++ {
		dst = append(dst, int32(binary.LittleEndian.Uint32(b[4*i:])))
	}
	return dst
}

func (r *reader) pages(dst []kvslab.PageID, n int) []kvslab.PageID {
	b := r.take(4 * n)
	dst = dst[:0]
	for i := 0; b != nil && i < n; i++ {
		dst = append(dst, kvslab.PageID(binary.LittleEndian.Uint32(b[4*i:])))
	}
	return dst
}

func (r *reader) f32s(dst []float32, n int) []float32 {
	b := r.take(4 * n)
	dst = dst[:0]
	for i := 0; b != nil && i < n; i++ {
		dst = append(dst, math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	}
	return dst
}

func (r *reader) u64s(dst []uint64, n int) []uint64 {
	b := r.take(8 * n)
	dst = dst[:0]
	for i := 0; b != nil && i < n; i++ {
		dst = append(dst, binary.LittleEndian.Uint64(b[8*i:]))
	}
	return dst
}

// UnmarshalBinary decodes data into p, reusing p's buffers (implements
// encoding.BinaryUnmarshaler). Malformed data returns an error wrapping ErrPlanEncoding
// and leaves p unspecified.
func (p *BatchPlan) UnmarshalBinary(data []byte) error {
	r := &reader{b: data}
	if m := r.take(4); r.err != nil || string(m) != planMagic {
		return fmt.Errorf("%w: bad magic", ErrPlanEncoding)
	}
	if v := r.u16(); v != planVersion {
		return fmt.Errorf("%w: version %d, this build reads %d", ErrPlanEncoding, v, planVersion)
	}
	if res := r.u16(); res != 0 {
		return fmt.Errorf("%w: reserved field %d", ErrPlanEncoding, res)
	}
	step := r.u64()
	graph := int32(r.u32())
	b, t, l, g := int(r.u32()), int(r.u32()), int(r.u32()), int(r.u32())
	if r.err != nil {
		return r.err
	}
	// Refuse counts the remaining bytes cannot hold before allocating anything.
	need := int64(b)*52 + 8*int64(b+1) + 8*int64(t) + 4*int64(l) + int64(g)*(8+8*int64(t)+4*int64(b+1))
	if g > maxGroups || need > int64(len(r.b)) {
		return fmt.Errorf("%w: %d sequences, %d tokens, %d logits rows, %d groups do not fit in %d bytes", ErrPlanEncoding, b, t, l, g, len(r.b))
	}
	p.reset(g)
	p.Step, p.GraphBatch = step, graph
	p.ReqIDs = r.u64s(p.ReqIDs, b)
	p.Computed = r.i32s(p.Computed, b)
	p.Scheduled = r.i32s(p.Scheduled, b)
	p.PromptLen = r.i32s(p.PromptLen, b)
	p.NumDrafts = r.i32s(p.NumDrafts, b)
	p.Temperature = r.f32s(p.Temperature, b)
	p.TopP = r.f32s(p.TopP, b)
	p.TopK = r.i32s(p.TopK, b)
	p.MinP = r.f32s(p.MinP, b)
	p.Seed = r.u64s(p.Seed, b)
	p.Logprobs = r.i32s(p.Logprobs, b)
	p.QueryStart = r.i32s(p.QueryStart, b+1)
	p.LogitsStart = r.i32s(p.LogitsStart, b+1)
	p.Tokens = r.i32s(p.Tokens, t)
	p.Positions = r.i32s(p.Positions, t)
	p.LogitsIndices = r.i32s(p.LogitsIndices, l)
	for i := 0; i < g && r.err == nil; i++ {
		gp := &p.Groups[i]
		np, ns := int(r.u32()), int(r.u32())
		if int64(np)*4+int64(ns)*4 > int64(len(r.b)) {
			return fmt.Errorf("%w: group %d claims %d pages and %d state pages beyond the data", ErrPlanEncoding, i, np, ns)
		}
		b8 := r.take(8 * t)
		gp.SlotMapping = gp.SlotMapping[:0]
		for j := 0; b8 != nil && j < t; j++ {
			gp.SlotMapping = append(gp.SlotMapping, int64(binary.LittleEndian.Uint64(b8[8*j:])))
		}
		gp.PageTableStart = r.i32s(gp.PageTableStart, b+1)
		gp.PageTable = r.pages(gp.PageTable, np)
		gp.StatePage = r.pages(gp.StatePage, ns)
	}
	if r.err != nil {
		return r.err
	}
	if len(r.b) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrPlanEncoding, len(r.b))
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrPlanEncoding, err)
	}
	for _, v := range p.Logprobs {
		if v >= 0 {
			p.anyLogprobs = true
		}
	}
	return nil
}

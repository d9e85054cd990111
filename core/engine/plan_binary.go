package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/kvslab"
)

// The BatchPlan binary encoding, version 3, little endian throughout:
//
//	magic "RSNP" | version u16 | reserved u16 (0)
//	Step u64 | GraphBatch i32 | B u32 | T u32 | L u32 | G u32
//	X u32 (which optional arrays follow: 1 penalties, 2 logit bias, 4 stop ids, 8 history,
//	  16 prompt logprobs)
//	NB u32 | NS u32 | NH u32 (logit-bias entries, stop ids, history tokens)
//	NR u32 | NC u32 (releases, cache ops)
//	Released (NR): ReqID u64 | Reason u8 | reserved u8[3] (0)
//	CacheOps (NC): Kind u8 | reserved u8[3] (0) | Group i32 | Src u32 | Dst u32
//	per sequence (B each): ReqIDs u64, Computed i32, Scheduled i32, PromptLen i32,
//	  NumDrafts i32, Temperature f32, TopP f32, TopK i32, MinP f32, Seed u64, Logprobs i32
//	X&1: PresencePenalty (B) f32 | FrequencyPenalty (B) f32 | RepetitionPenalty (B) f32 |
//	  MinTokens (B) i32
//	QueryStart (B+1) i32 | LogitsStart (B+1) i32
//	Tokens (T) i32 | Positions (T) i32 | LogitsIndices (L) i32
//	X&2: LogitBiasStart (B+1) i32 | LogitBiasTokens (NB) i32 | LogitBiasValues (NB) f32
//	X&4: StopIDsStart (B+1) i32 | StopIDs (NS) i32
//	X&8: HistoryStart (B+1) i32 | History (NH) i32
//	X&16: PromptLogprobs (B) i32 | PromptNext (B) i32
//	per group: P u32 | S u32 | SlotMapping (T) i64 | PageTableStart (B+1) i32 |
//	  PageTable (P) u32 | StatePage (S) u32
//
// Version 1 lacked X, NB, NS, NH and the optional arrays (the sampling features of
// version 2: penalties, logit bias, min_tokens, prompt logprobs); version 2 lacked NR,
// NC, Released and CacheOps. A runner handles Released, then executes CacheOps in order,
// then the step (see BatchPlan).
//
// A decoder rejects other versions, a non-zero reserved field, trailing bytes and any plan
// that fails Validate.

const (
	planMagic    = "RSNP"
	planVersion  = 3
	headerBytes  = 4 + 2 + 2 + 8 + 4 + 4*4 + 4*4 + 2*4
	releaseBytes = 12
	cacheOpBytes = 16
	maxGroups    = 1 << 10
)

// ErrPlanEncoding is wrapped by every UnmarshalBinary error.
var ErrPlanEncoding = errors.New("engine: malformed BatchPlan encoding")

// MarshalBinary encodes the plan (implements encoding.BinaryMarshaler).
func (p *BatchPlan) MarshalBinary() ([]byte, error) {
	return p.AppendBinary(make([]byte, 0, p.encodedLen()))
}

func (p *BatchPlan) encodedLen() int {
	b, t := len(p.ReqIDs), len(p.Tokens)
	arrays, _ := ArraysSize(p.OptionalArrays(), int64(b), int64(t), int64(len(p.LogitsIndices)),
		int64(len(p.LogitBiasTokens)), int64(len(p.StopIDs)), int64(len(p.History)))
	n := headerBytes + releaseBytes*len(p.Released) + cacheOpBytes*len(p.CacheOps) + int(arrays)
	for g := range p.Groups {
		gp := &p.Groups[g]
		n += 8 + 8*t + 4*(b+1) + 4*len(gp.PageTable) + 4*len(gp.StatePage)
	}
	return n
}

// The bits of the encoding's X field.
const (
	optPenalties = 1 << iota
	optBias
	optStops
	optHistory
	optPrompt
)

// OptionalArrays returns the encoding's X field: which optional arrays the plan has.
func (p *BatchPlan) OptionalArrays() uint32 {
	var x uint32
	if len(p.PresencePenalty)+len(p.FrequencyPenalty)+len(p.RepetitionPenalty)+len(p.MinTokens) > 0 {
		x |= optPenalties
	}
	if len(p.LogitBiasStart) > 0 {
		x |= optBias
	}
	if len(p.StopIDsStart) > 0 {
		x |= optStops
	}
	if len(p.HistoryStart) > 0 {
		x |= optHistory
	}
	if len(p.PromptLogprobs) > 0 {
		x |= optPrompt
	}
	return x
}

// appendOr appends s, or n copies of def when s is empty.
func appendOr[T int32 | float32](dst []byte, s []T, n int, def T) []byte {
	le := binary.LittleEndian
	for i := 0; i < n; i++ {
		v := def
		if len(s) > 0 {
			v = s[i]
		}
		switch v := any(v).(type) {
		case int32:
			dst = le.AppendUint32(dst, uint32(v))
		case float32:
			dst = le.AppendUint32(dst, math.Float32bits(v))
		}
	}
	return dst
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
	x := p.OptionalArrays()
	for _, n := range [...]int{len(p.ReqIDs), len(p.Tokens), len(p.LogitsIndices), len(p.Groups), int(x),
		len(p.LogitBiasTokens), len(p.StopIDs), len(p.History), len(p.Released), len(p.CacheOps)} {
		dst = le.AppendUint32(dst, uint32(n))
	}
	for _, r := range p.Released {
		dst = le.AppendUint64(dst, r.ReqID)
		dst = le.AppendUint32(dst, uint32(r.Reason))
	}
	for _, op := range p.CacheOps {
		dst = le.AppendUint32(dst, uint32(op.Kind))
		dst = le.AppendUint32(dst, uint32(op.Group))
		dst = le.AppendUint32(dst, uint32(op.Src))
		dst = le.AppendUint32(dst, uint32(op.Dst))
	}
	dst = p.AppendArrays(dst)
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

// AppendArrays appends the plan's arrays section of the encoding: from the per-sequence
// ReqIDs to PromptNext, the optional arrays those p.OptionalArrays() names. core/wire's
// Step message carries the same section.
func (p *BatchPlan) AppendArrays(dst []byte) []byte {
	le := binary.LittleEndian
	x := p.OptionalArrays()
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
	b := len(p.ReqIDs)
	if x&optPenalties != 0 {
		dst = appendOr(dst, p.PresencePenalty, b, 0)
		dst = appendOr(dst, p.FrequencyPenalty, b, 0)
		dst = appendOr(dst, p.RepetitionPenalty, b, 1)
		dst = appendOr(dst, p.MinTokens, b, 0)
	}
	dst = appendI32(dst, p.QueryStart)
	dst = appendI32(dst, p.LogitsStart)
	dst = appendI32(dst, p.Tokens)
	dst = appendI32(dst, p.Positions)
	dst = appendI32(dst, p.LogitsIndices)
	if x&optBias != 0 {
		dst = appendI32(dst, p.LogitBiasStart)
		dst = appendI32(dst, p.LogitBiasTokens)
		dst = appendF32(dst, p.LogitBiasValues)
	}
	if x&optStops != 0 {
		dst = appendI32(dst, p.StopIDsStart)
		dst = appendI32(dst, p.StopIDs)
	}
	if x&optHistory != 0 {
		dst = appendI32(dst, p.HistoryStart)
		dst = appendI32(dst, p.History)
	}
	if x&optPrompt != 0 {
		dst = appendI32(dst, p.PromptLogprobs)
		dst = appendI32(dst, p.PromptNext)
	}
	return dst
}

// ArraysSize returns the length of the arrays section (see AppendArrays) of a plan of b
// sequences, t tokens and l logits rows with the optional arrays x names, nb logit-bias
// entries, ns stop ids and nh history tokens. It fails when x names unknown arrays or a
// count of an absent array is not zero.
func ArraysSize(x uint32, b, t, l, nb, ns, nh int64) (int64, error) {
	if x >= optPrompt<<1 {
		return 0, fmt.Errorf("unknown optional arrays %#x", x)
	}
	n := 52*b + 8*(b+1) + 8*t + 4*l
	if x&optPenalties != 0 {
		n += 16 * b
	}
	if x&optPrompt != 0 {
		n += 8 * b
	}
	for _, o := range [...]struct {
		bit uint32
		n   int64
	}{{optBias, 2 * nb}, {optStops, ns}, {optHistory, nh}} {
		if x&o.bit != 0 {
			n += 4*(b+1) + 4*o.n
		} else if o.n != 0 {
			return 0, fmt.Errorf("%d values of an absent optional array", o.n)
		}
	}
	return n, nil
}

// DecodeArrays decodes into p (reusing its buffers) the arrays section AppendArrays wrote
// for the counts given (see ArraysSize) from the start of data, and returns the bytes after
// it. Absent optional arrays are left empty. A short data returns an error wrapping
// ErrPlanEncoding; the plan is not validated.
func (p *BatchPlan) DecodeArrays(data []byte, x uint32, b, t, l, nb, ns, nh int) ([]byte, error) {
	r := &reader{b: data}
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
	p.PresencePenalty, p.FrequencyPenalty, p.RepetitionPenalty, p.MinTokens = p.PresencePenalty[:0], p.FrequencyPenalty[:0], p.RepetitionPenalty[:0], p.MinTokens[:0]
	if x&optPenalties != 0 {
		p.PresencePenalty = r.f32s(p.PresencePenalty, b)
		p.FrequencyPenalty = r.f32s(p.FrequencyPenalty, b)
		p.RepetitionPenalty = r.f32s(p.RepetitionPenalty, b)
		p.MinTokens = r.i32s(p.MinTokens, b)
	}
	p.QueryStart = r.i32s(p.QueryStart, b+1)
	p.LogitsStart = r.i32s(p.LogitsStart, b+1)
	p.Tokens = r.i32s(p.Tokens, t)
	p.Positions = r.i32s(p.Positions, t)
	p.LogitsIndices = r.i32s(p.LogitsIndices, l)
	p.LogitBiasStart, p.LogitBiasTokens, p.LogitBiasValues = p.LogitBiasStart[:0], p.LogitBiasTokens[:0], p.LogitBiasValues[:0]
	if x&optBias != 0 {
		p.LogitBiasStart = r.i32s(p.LogitBiasStart, b+1)
		p.LogitBiasTokens = r.i32s(p.LogitBiasTokens, nb)
		p.LogitBiasValues = r.f32s(p.LogitBiasValues, nb)
	}
	p.StopIDsStart, p.StopIDs = p.StopIDsStart[:0], p.StopIDs[:0]
	if x&optStops != 0 {
		p.StopIDsStart = r.i32s(p.StopIDsStart, b+1)
		p.StopIDs = r.i32s(p.StopIDs, ns)
	}
	p.HistoryStart, p.History = p.HistoryStart[:0], p.History[:0]
	if x&optHistory != 0 {
		p.HistoryStart = r.i32s(p.HistoryStart, b+1)
		p.History = r.i32s(p.History, nh)
	}
	p.PromptLogprobs, p.PromptNext = p.PromptLogprobs[:0], p.PromptNext[:0]
	if x&optPrompt != 0 {
		p.PromptLogprobs = r.i32s(p.PromptLogprobs, b)
		p.PromptNext = r.i32s(p.PromptNext, b)
	}
	return r.b, r.err
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
	x, nb, ns, nh := r.u32(), int64(r.u32()), int64(r.u32()), int64(r.u32())
	nr, nc := int64(r.u32()), int64(r.u32())
	if r.err != nil {
		return r.err
	}
	arrays, err := ArraysSize(x, int64(b), int64(t), int64(l), nb, ns, nh)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrPlanEncoding, err)
	}
	// Refuse counts the remaining bytes cannot hold before allocating anything.
	need := releaseBytes*nr + cacheOpBytes*nc + arrays + int64(g)*(8+8*int64(t)+4*int64(b+1))
	if g > maxGroups || need > int64(len(r.b)) {
		return fmt.Errorf("%w: %d sequences, %d tokens, %d logits rows, %d groups do not fit in %d bytes", ErrPlanEncoding, b, t, l, g, len(r.b))
	}
	p.reset(g)
	p.Step, p.GraphBatch = step, graph
	for range nr {
		id, w := r.u64(), r.u32()
		if w > 0xff {
			return fmt.Errorf("%w: release of request %d: reserved bytes %#x", ErrPlanEncoding, id, w>>8)
		}
		p.Released = append(p.Released, Release{ReqID: id, Reason: ReleaseReason(w)})
	}
	for range nc {
		w, grp, src, dst := r.u32(), int32(r.u32()), kvslab.PageID(r.u32()), kvslab.PageID(r.u32())
		if w > 0xff {
			return fmt.Errorf("%w: cache op: reserved bytes %#x", ErrPlanEncoding, w>>8)
		}
		p.CacheOps = append(p.CacheOps, CacheOp{Kind: CacheOpKind(w), Group: grp, Src: src, Dst: dst})
	}
	if r.b, err = p.DecodeArrays(r.b, x, b, t, l, int(nb), int(ns), int(nh)); err != nil {
		return err
	}
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

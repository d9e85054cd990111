package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/internal/binenc"
	"github.com/resin-llm/resin/core/kvslab"
)

// The BatchPlan binary encoding, version 4, little endian throughout:
//
//	magic "RSNP" | version u16 | reserved u16 (0)
//	Step u64 | GraphBatch i32 | B u32 | T u32 | L u32 | G u32
//	X u32 (which optional arrays follow: 1 penalties, 2 logit bias, 4 stop ids, 8 history,
//	  16 prompt logprobs, 32 token masks)
//	NB u32 | NS u32 | NH u32 (logit-bias entries, stop ids, history tokens)
//	NR u32 | NC u32 (releases, cache ops)
//	DPRank i32 | DPPad i32 | ND u32 | DPTokens (ND) i32 (DP: the plan's data-parallel step)
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
//	X&32: TokenMaskStart (B+1) i32 | TokenMask (TokenMaskStart[B]) u32
//	per group: P u32 | S u32 | SlotMapping (T) i64 | PageTableStart (B+1) i32 |
//	  PageTable (P) u32 | StatePage (S) u32
//
// Version 1 lacked X, NB, NS, NH and the optional arrays (the sampling features of
// version 2: penalties, logit bias, min_tokens, prompt logprobs); version 2 lacked NR,
// NC, Released and CacheOps. The token masks (X&32) came within version 3: a decoder
// that predates them refuses a plan that has them as naming unknown optional arrays,
// and a plan without constrained sequences encodes as before. Version 3 lacked the DP
// fields: a version-3 decoder refuses every version-4 plan, and this one refuses
// version 3 (the ranks of one group run one build). A runner handles Released, then executes CacheOps in order,
// then the step (see BatchPlan).
//
// A decoder rejects other versions, a non-zero reserved field, trailing bytes and any plan
// that fails Validate.

const (
	planMagic    = "RSNP"
	planVersion  = 4
	headerBytes  = 4 + 2 + 2 + 8 + 4 + 4*4 + 4*4 + 2*4 + 3*4
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
	n := headerBytes + 4*len(p.DP.Tokens) + releaseBytes*len(p.Released) + cacheOpBytes*len(p.CacheOps) + int(arrays)
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
	optMasks
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
	if len(p.TokenMaskStart) > 0 {
		x |= optMasks
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
	dst = le.AppendUint32(dst, uint32(p.DP.Rank))
	dst = le.AppendUint32(dst, uint32(p.DP.Pad))
	dst = le.AppendUint32(dst, uint32(len(p.DP.Tokens)))
	dst = binenc.AppendI32s(dst, p.DP.Tokens)
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
		dst = binenc.AppendI32s(dst, gp.PageTableStart)
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
	x := p.OptionalArrays()
	dst = binenc.AppendU64s(dst, p.ReqIDs)
	dst = binenc.AppendI32s(dst, p.Computed)
	dst = binenc.AppendI32s(dst, p.Scheduled)
	dst = binenc.AppendI32s(dst, p.PromptLen)
	dst = binenc.AppendI32s(dst, p.NumDrafts)
	dst = binenc.AppendF32s(dst, p.Temperature)
	dst = binenc.AppendF32s(dst, p.TopP)
	dst = binenc.AppendI32s(dst, p.TopK)
	dst = binenc.AppendF32s(dst, p.MinP)
	dst = binenc.AppendU64s(dst, p.Seed)
	dst = binenc.AppendI32s(dst, p.Logprobs)
	b := len(p.ReqIDs)
	if x&optPenalties != 0 {
		dst = appendOr(dst, p.PresencePenalty, b, 0)
		dst = appendOr(dst, p.FrequencyPenalty, b, 0)
		dst = appendOr(dst, p.RepetitionPenalty, b, 1)
		dst = appendOr(dst, p.MinTokens, b, 0)
	}
	dst = binenc.AppendI32s(dst, p.QueryStart)
	dst = binenc.AppendI32s(dst, p.LogitsStart)
	dst = binenc.AppendI32s(dst, p.Tokens)
	dst = binenc.AppendI32s(dst, p.Positions)
	dst = binenc.AppendI32s(dst, p.LogitsIndices)
	if x&optBias != 0 {
		dst = binenc.AppendI32s(dst, p.LogitBiasStart)
		dst = binenc.AppendI32s(dst, p.LogitBiasTokens)
		dst = binenc.AppendF32s(dst, p.LogitBiasValues)
	}
	if x&optStops != 0 {
		dst = binenc.AppendI32s(dst, p.StopIDsStart)
		dst = binenc.AppendI32s(dst, p.StopIDs)
	}
	if x&optHistory != 0 {
		dst = binenc.AppendI32s(dst, p.HistoryStart)
		dst = binenc.AppendI32s(dst, p.History)
	}
	if x&optPrompt != 0 {
		dst = binenc.AppendI32s(dst, p.PromptLogprobs)
		dst = binenc.AppendI32s(dst, p.PromptNext)
	}
	if x&optMasks != 0 {
		dst = binenc.AppendI32s(dst, p.TokenMaskStart)
		le := binary.LittleEndian
		for _, w := range p.TokenMask {
			dst = le.AppendUint32(dst, w)
		}
	}
	return dst
}

// ArraysSize returns the length of the arrays section (see AppendArrays) of a plan of b
// sequences, t tokens and l logits rows with the optional arrays x names, nb logit-bias
// entries, ns stop ids and nh history tokens; with token masks (whose length the section
// itself gives) it is the length without their words. It fails when x names unknown
// arrays or a count of an absent array is not zero.
func ArraysSize(x uint32, b, t, l, nb, ns, nh int64) (int64, error) {
	if x >= optMasks<<1 {
		return 0, fmt.Errorf("unknown optional arrays %#x", x)
	}
	n := 52*b + 8*(b+1) + 8*t + 4*l
	if x&optPenalties != 0 {
		n += 16 * b
	}
	if x&optPrompt != 0 {
		n += 8 * b
	}
	if x&optMasks != 0 {
		n += 4 * (b + 1)
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
	r := newReader(data)
	p.ReqIDs = r.U64s(p.ReqIDs, b)
	p.Computed = r.I32s(p.Computed, b)
	p.Scheduled = r.I32s(p.Scheduled, b)
	p.PromptLen = r.I32s(p.PromptLen, b)
	p.NumDrafts = r.I32s(p.NumDrafts, b)
	p.Temperature = r.F32s(p.Temperature, b)
	p.TopP = r.F32s(p.TopP, b)
	p.TopK = r.I32s(p.TopK, b)
	p.MinP = r.F32s(p.MinP, b)
	p.Seed = r.U64s(p.Seed, b)
	p.Logprobs = r.I32s(p.Logprobs, b)
	p.PresencePenalty, p.FrequencyPenalty, p.RepetitionPenalty, p.MinTokens = p.PresencePenalty[:0], p.FrequencyPenalty[:0], p.RepetitionPenalty[:0], p.MinTokens[:0]
	if x&optPenalties != 0 {
		p.PresencePenalty = r.F32s(p.PresencePenalty, b)
		p.FrequencyPenalty = r.F32s(p.FrequencyPenalty, b)
		p.RepetitionPenalty = r.F32s(p.RepetitionPenalty, b)
		p.MinTokens = r.I32s(p.MinTokens, b)
	}
	p.QueryStart = r.I32s(p.QueryStart, b+1)
	p.LogitsStart = r.I32s(p.LogitsStart, b+1)
	p.Tokens = r.I32s(p.Tokens, t)
	p.Positions = r.I32s(p.Positions, t)
	p.LogitsIndices = r.I32s(p.LogitsIndices, l)
	p.LogitBiasStart, p.LogitBiasTokens, p.LogitBiasValues = p.LogitBiasStart[:0], p.LogitBiasTokens[:0], p.LogitBiasValues[:0]
	if x&optBias != 0 {
		p.LogitBiasStart = r.I32s(p.LogitBiasStart, b+1)
		p.LogitBiasTokens = r.I32s(p.LogitBiasTokens, nb)
		p.LogitBiasValues = r.F32s(p.LogitBiasValues, nb)
	}
	p.StopIDsStart, p.StopIDs = p.StopIDsStart[:0], p.StopIDs[:0]
	if x&optStops != 0 {
		p.StopIDsStart = r.I32s(p.StopIDsStart, b+1)
		p.StopIDs = r.I32s(p.StopIDs, ns)
	}
	p.HistoryStart, p.History = p.HistoryStart[:0], p.History[:0]
	if x&optHistory != 0 {
		p.HistoryStart = r.I32s(p.HistoryStart, b+1)
		p.History = r.I32s(p.History, nh)
	}
	p.PromptLogprobs, p.PromptNext = p.PromptLogprobs[:0], p.PromptNext[:0]
	if x&optPrompt != 0 {
		p.PromptLogprobs = r.I32s(p.PromptLogprobs, b)
		p.PromptNext = r.I32s(p.PromptNext, b)
	}
	p.TokenMaskStart, p.TokenMask = p.TokenMaskStart[:0], p.TokenMask[:0]
	if x&optMasks != 0 {
		p.TokenMaskStart = r.I32s(p.TokenMaskStart, b+1)
		if r.Err != nil {
			return nil, r.Err
		}
		n := int64(p.TokenMaskStart[b])
		if n < 0 || 4*n > int64(r.Left()) {
			return nil, fmt.Errorf("%w: %d token-mask words, %d bytes left", ErrPlanEncoding, n, r.Left())
		}
		p.TokenMask = binenc.U32s(r, p.TokenMask, int(n))
	}
	return r.B[r.Off:], r.Err
}

// newReader reads data, its errors wrapping ErrPlanEncoding.
func newReader(data []byte) *binenc.Reader {
	return &binenc.Reader{B: data, Short: func(_ string, n, _, left int) error {
		return fmt.Errorf("%w: need %d bytes, %d left", ErrPlanEncoding, n, left)
	}}
}

// UnmarshalBinary decodes data into p, reusing p's buffers (implements
// encoding.BinaryUnmarshaler). Malformed data returns an error wrapping ErrPlanEncoding
// and leaves p unspecified.
func (p *BatchPlan) UnmarshalBinary(data []byte) error {
	r := newReader(data)
	if m := r.Take(4); r.Err != nil || string(m) != planMagic {
		return fmt.Errorf("%w: bad magic", ErrPlanEncoding)
	}
	if v := r.U16(); v != planVersion {
		return fmt.Errorf("%w: version %d, this build reads %d", ErrPlanEncoding, v, planVersion)
	}
	if res := r.U16(); res != 0 {
		return fmt.Errorf("%w: reserved field %d", ErrPlanEncoding, res)
	}
	step := r.U64()
	graph := int32(r.U32())
	b, t, l, g := int(r.U32()), int(r.U32()), int(r.U32()), int(r.U32())
	x, nb, ns, nh := r.U32(), int64(r.U32()), int64(r.U32()), int64(r.U32())
	nr, nc := int64(r.U32()), int64(r.U32())
	dpRank, dpPad, nd := int32(r.U32()), int32(r.U32()), int64(r.U32())
	if r.Err != nil {
		return r.Err
	}
	arrays, err := ArraysSize(x, int64(b), int64(t), int64(l), nb, ns, nh)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrPlanEncoding, err)
	}
	// Refuse counts the remaining bytes cannot hold before allocating anything.
	need := 4*nd + releaseBytes*nr + cacheOpBytes*nc + arrays + int64(g)*(8+8*int64(t)+4*int64(b+1))
	if g > maxGroups || need > int64(r.Left()) {
		return fmt.Errorf("%w: %d sequences, %d tokens, %d logits rows, %d groups do not fit in %d bytes", ErrPlanEncoding, b, t, l, g, r.Left())
	}
	p.reset(g)
	p.Step, p.GraphBatch = step, graph
	p.DP.Rank, p.DP.Pad = dpRank, dpPad
	p.DP.Tokens = r.I32s(p.DP.Tokens, int(nd))
	for range nr {
		id, w := r.U64(), r.U32()
		if w > 0xff {
			return fmt.Errorf("%w: release of request %d: reserved bytes %#x", ErrPlanEncoding, id, w>>8)
		}
		p.Released = append(p.Released, Release{ReqID: id, Reason: ReleaseReason(w)})
	}
	for range nc {
		w, grp, src, dst := r.U32(), int32(r.U32()), kvslab.PageID(r.U32()), kvslab.PageID(r.U32())
		if w > 0xff {
			return fmt.Errorf("%w: cache op: reserved bytes %#x", ErrPlanEncoding, w>>8)
		}
		p.CacheOps = append(p.CacheOps, CacheOp{Kind: CacheOpKind(w), Group: grp, Src: src, Dst: dst})
	}
	rest, err := p.DecodeArrays(r.B[r.Off:], x, b, t, l, int(nb), int(ns), int(nh))
	if err != nil {
		return err
	}
	r.Off = len(r.B) - len(rest)
	for i := 0; i < g && r.Err == nil; i++ {
		gp := &p.Groups[i]
		np, ns := int(r.U32()), int(r.U32())
		if int64(np)*4+int64(ns)*4 > int64(r.Left()) {
			return fmt.Errorf("%w: group %d claims %d pages and %d state pages beyond the data", ErrPlanEncoding, i, np, ns)
		}
		gp.SlotMapping = r.I64s(gp.SlotMapping, t)
		gp.PageTableStart = r.I32s(gp.PageTableStart, b+1)
		gp.PageTable = binenc.U32s(r, gp.PageTable, np)
		gp.StatePage = binenc.U32s(r, gp.StatePage, ns)
	}
	if r.Err != nil {
		return r.Err
	}
	if r.Left() != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrPlanEncoding, r.Left())
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

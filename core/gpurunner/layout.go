package gpurunner

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/kvslab"
)

// view is section s of buf as a slice of T; s is aligned for T (sections start at
// multiples of 16 in a buffer aligned to 8, the largest element).
func view[T any](buf []byte, s Section) []T {
	var z T
	n := int(s.Len) / int(unsafe.Sizeof(z))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&buf[s.Off])), n)
}

// littleEndian reports whether the host stores integers as the device does.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// SampleRowBytes is the size of one logits row's sampling parameters in an upload: a
// cuda.SampleParams stored as its Go struct, which a test holds to the kernel's layout
// (little-endian, the fields in order, no padding).
const SampleRowBytes = cuda.SampleParamsBytes

// sectionAlign is the byte alignment of every section of a plan upload: 16 bytes lets a
// kernel read any section with 128-bit loads and keeps the int64 slots aligned.
const sectionAlign = 16

// Dims are the sizes a plan upload is laid out for. A plan fits Dims when it has at most
// Tokens tokens, Seqs sequences, Rows logits rows and PagesPerSeq pages per sequence in
// each of Groups cache groups; the rest is padding (see PlanLayout.Pack).
type Dims struct {
	Tokens      int // T: token rows
	Seqs        int // B: sequences
	Rows        int // R: logits rows
	PagesPerSeq int // width of each group's rectangular page table
	Groups      int // cache groups with a slot mapping and a page table
}

// PlanDims returns the smallest Dims that fit plan (page tables as wide as its longest).
func PlanDims(plan *engine.BatchPlan) Dims {
	d := Dims{Tokens: plan.NumTokens(), Seqs: plan.NumSeqs(), Rows: len(plan.LogitsIndices), Groups: len(plan.Groups)}
	for g := range plan.Groups {
		st := plan.Groups[g].PageTableStart
		for i := 0; i+1 < len(st); i++ {
			d.PagesPerSeq = max(d.PagesPerSeq, int(st[i+1]-st[i]))
		}
	}
	return d
}

// Fits reports whether every size of d is at most the one of o.
func (d Dims) Fits(o Dims) bool {
	return d.Tokens <= o.Tokens && d.Seqs <= o.Seqs && d.Rows <= o.Rows && d.PagesPerSeq <= o.PagesPerSeq && d.Groups <= o.Groups
}

// Section is a byte range of a plan upload.
type Section struct {
	Off, Len int64
}

// PlanLayout is where each array of a step's inputs sits in the one buffer the runner
// copies to the device per step. Every section starts at a multiple of 16 bytes; the
// element types are fixed:
//
//	Tokens        [T]      int32   token ids (padding: 0)
//	Positions     [T]      int32   positions (padding: 0)
//	QueryStart    [B+1]    int32   offsets of each sequence's tokens (padding sequences take the padding tokens)
//	CtxLens       [B]      int32   Computed+Scheduled: keys each sequence attends to after the step (padding: 0)
//	LogitsIndices [R]      int32   token rows whose logits are computed (padding: 0)
//	Sampling      [R]      32 bytes per logits row: its sequence's sampling row as
//	                               core/kernels/cuda.SampleParams encodes it (temperature,
//	                               top-p, min-p, top-k, seed, the sampled token's position
//	                               Positions[row]+1, logprobs wanted); padding: greedy
//	MaskStart     [R]      int32   word offset of each logits row's token mask in the
//	                               workspace's TokenMask, where the plan's TokenMask is
//	                               uploaded as it is (BatchPlan.TokenMaskOf); -1: the row
//	                               is not constrained (padding: -1)
//	per group g:
//	  Slots[g]          [T]    int64   cache slot of each token (engine.NoSlot = -1: not written; padding: -1)
//	  PageTableStart[g] [B+1]  int32   offsets of each sequence's pages in PageTable[g] (padding sequences: none)
//	  PageTable[g]      [B·P]  uint32  the plan's page ids, ragged as in engine.GroupPlan (the
//	                                   rest is not written: nothing reads past PageTableStart);
//	                                   P = PagesPerSeq bounds every sequence's pages
//
// A layout depends on Dims only, so the layout of a CUDA-graph bucket puts every array at
// the same device address at every step: the graph captured once reads each step's plan.
type PlanLayout struct {
	Dims                                                                       Dims
	Tokens, Positions, QueryStart, CtxLens, LogitsIndices, Sampling, MaskStart Section
	Slots, PageTableStart, PageTable                                           []Section
	// Size is the bytes of the whole upload.
	Size int64
}

// NewPlanLayout lays out a plan upload of dims d.
func NewPlanLayout(d Dims) (PlanLayout, error) {
	var l PlanLayout
	err := l.init(d)
	return l, err
}

// init lays l out for d, reusing its slices (an eager step's layout allocates nothing).
func (l *PlanLayout) init(d Dims) error {
	if d.Tokens <= 0 || d.Seqs <= 0 || d.Rows < 0 || d.PagesPerSeq < 0 || d.Groups < 0 {
		return fmt.Errorf("gpurunner: plan layout of %+v: tokens and sequences must be positive, the rest not negative", d)
	}
	l.Dims = d
	var off int64
	next := func(n, elem int) Section {
		s := Section{Off: off, Len: int64(n) * int64(elem)}
		off += (s.Len + sectionAlign - 1) / sectionAlign * sectionAlign
		return s
	}
	l.Tokens = next(d.Tokens, 4)
	l.Positions = next(d.Tokens, 4)
	l.QueryStart = next(d.Seqs+1, 4)
	l.CtxLens = next(d.Seqs, 4)
	l.LogitsIndices = next(d.Rows, 4)
	l.Sampling = next(d.Rows, SampleRowBytes)
	l.MaskStart = next(d.Rows, 4)
	l.Slots = resize(l.Slots, d.Groups)
	l.PageTableStart = resize(l.PageTableStart, d.Groups)
	l.PageTable = resize(l.PageTable, d.Groups)
	for g := 0; g < d.Groups; g++ {
		l.Slots[g] = next(d.Tokens, 8)
		l.PageTableStart[g] = next(d.Seqs+1, 4)
		l.PageTable[g] = next(d.Seqs*d.PagesPerSeq, 4)
	}
	l.Size = off
	if l.Size > math.MaxInt32 {
		return fmt.Errorf("gpurunner: plan layout of %+v needs %d bytes", d, l.Size)
	}
	return nil
}

func resize(s []Section, n int) []Section {
	if cap(s) < n {
		return make([]Section, n)
	}
	return s[:n]
}

// Pack writes plan into buf (at least l.Size bytes) at the layout's offsets, filling the
// rows past the plan's with padding: padding tokens write no cache slot, padding
// sequences attend to nothing (CtxLens 0) and share the padding tokens evenly, the last
// one taking the remainder (so a padded decode batch gives each the plan's tokens per
// sequence). It allocates nothing.
func (l *PlanLayout) Pack(buf []byte, plan *engine.BatchPlan) error {
	pd := PlanDims(plan)
	if !pd.Fits(l.Dims) || pd.Groups != l.Dims.Groups {
		return fmt.Errorf("gpurunner: plan of %+v does not fit the layout of %+v", pd, l.Dims)
	}
	if int64(len(buf)) < l.Size {
		return fmt.Errorf("gpurunner: pack into %d bytes, the layout needs %d", len(buf), l.Size)
	}
	if !littleEndian {
		return fmt.Errorf("gpurunner: a big-endian host cannot upload plans to the device as they are")
	}
	if len(buf) > 0 && uintptr(unsafe.Pointer(&buf[0]))%8 != 0 {
		return fmt.Errorf("gpurunner: pack into a buffer not aligned to 8 bytes (its int64 slots)")
	}
	b, t := pd.Seqs, pd.Tokens
	if b == l.Dims.Seqs && l.Dims.Tokens > t {
		return fmt.Errorf("gpurunner: %d padding tokens and no padding sequence to hold them", l.Dims.Tokens-t)
	}
	// Typed views of the sections: the host is little-endian like the device (checked at
	// init), so the plan's arrays are copied as they are.
	i32 := func(sec Section) []int32 { return view[int32](buf, sec) }
	copy(i32(l.Tokens), plan.Tokens)
	clear(i32(l.Tokens)[t:])
	copy(i32(l.Positions), plan.Positions)
	clear(i32(l.Positions)[t:])
	// QueryStart: the plan's, then the padding sequences share the padding tokens.
	qs := i32(l.QueryStart)
	copy(qs, plan.QueryStart)
	if pad := l.Dims.Seqs - b; pad > 0 {
		each := int32((l.Dims.Tokens - t) / pad)
		for i := b + 1; i < l.Dims.Seqs; i++ {
			qs[i] = qs[i-1] + each
		}
		qs[l.Dims.Seqs] = int32(l.Dims.Tokens) // the last takes the remainder
	}
	ctx := i32(l.CtxLens)
	for i := 0; i < b; i++ {
		ctx[i] = plan.Computed[i] + plan.Scheduled[i]
	}
	clear(ctx[b:])
	// Logits rows and the sampling row of each one's sequence.
	rows, params := i32(l.LogitsIndices), view[cuda.SampleParams](buf, l.Sampling)
	r := 0
	for i := 0; i < b; i++ {
		for j := plan.LogitsStart[i]; j < plan.LogitsStart[i+1]; j++ {
			idx := plan.LogitsIndices[j]
			rows[r] = idx
			params[r] = cuda.SampleParams{Temperature: plan.Temperature[i], TopP: plan.TopP[i], MinP: plan.MinP[i], TopK: plan.TopK[i],
				Seed: plan.Seed[i], Pos: plan.Positions[idx] + 1, Logprobs: plan.Logprobs[i]}
			r++
		}
	}
	clear(rows[r:])
	for ; r < l.Dims.Rows; r++ {
		params[r] = cuda.SampleParams{TopP: 1, Logprobs: -1}
	}
	// Each row's mask: sequence i's rows follow one another from TokenMaskStart[i].
	starts := i32(l.MaskStart)
	r = 0
	for i := 0; i < b; i++ {
		n := int(plan.LogitsStart[i+1] - plan.LogitsStart[i])
		var a, w int32 = -1, 0
		if len(plan.TokenMaskStart) > 0 && n > 0 && plan.TokenMaskStart[i+1] > plan.TokenMaskStart[i] {
			a, w = plan.TokenMaskStart[i], (plan.TokenMaskStart[i+1]-plan.TokenMaskStart[i])/int32(n)
		}
		for j := 0; j < n; j++ {
			starts[r] = -1
			if a >= 0 {
				starts[r] = a + int32(j)*w
			}
			r++
		}
	}
	for ; r < l.Dims.Rows; r++ {
		starts[r] = -1
	}
	for g := 0; g < l.Dims.Groups; g++ {
		gp := &plan.Groups[g]
		slots := view[int64](buf, l.Slots[g])
		copy(slots, gp.SlotMapping)
		for i := t; i < len(slots); i++ {
			slots[i] = engine.NoSlot
		}
		pts := i32(l.PageTableStart[g])
		copy(pts, gp.PageTableStart)
		for i := b + 1; i < len(pts); i++ {
			pts[i] = gp.PageTableStart[b]
		}
		// Entries past the plan's pages are never read (PageTableStart bounds them).
		copy(view[kvslab.PageID](buf, l.PageTable[g]), gp.PageTable)
	}
	return nil
}

package gpurunner

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/engine"
)

// SampleRowBytes is the size of one logits row's sampling parameters in an upload
// (core/kernels/cuda.SampleParamsBytes: a test holds them equal).
const SampleRowBytes = 32

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
//	per group g:
//	  Slots[g]          [T]    int64   cache slot of each token (engine.NoSlot = -1: not written; padding: -1)
//	  PageTableStart[g] [B+1]  int32   offsets of each sequence's pages in PageTable[g] (padding sequences: none)
//	  PageTable[g]      [B·P]  uint32  the plan's page ids, ragged as in engine.GroupPlan, then zeros;
//	                                   P = PagesPerSeq bounds every sequence's pages
//
// A layout depends on Dims only, so the layout of a CUDA-graph bucket puts every array at
// the same device address at every step: the graph captured once reads each step's plan.
type PlanLayout struct {
	Dims                                                            Dims
	Tokens, Positions, QueryStart, CtxLens, LogitsIndices, Sampling Section
	Slots, PageTableStart, PageTable                                []Section
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
	b, t := pd.Seqs, pd.Tokens
	if b == l.Dims.Seqs && l.Dims.Tokens > t {
		return fmt.Errorf("gpurunner: %d padding tokens and no padding sequence to hold them", l.Dims.Tokens-t)
	}
	le := binary.LittleEndian
	put32 := func(s Section, i int, v uint32) { le.PutUint32(buf[s.Off+int64(i)*4:], v) }
	put64 := func(s Section, i int, v uint64) { le.PutUint64(buf[s.Off+int64(i)*8:], v) }
	putRow := func(r int, temp, topP, minP float32, topK int32, seed uint64, pos, logprobs int32) {
		b := buf[l.Sampling.Off+int64(r)*SampleRowBytes:]
		le.PutUint32(b[0:], math.Float32bits(temp))
		le.PutUint32(b[4:], math.Float32bits(topP))
		le.PutUint32(b[8:], math.Float32bits(minP))
		le.PutUint32(b[12:], uint32(topK))
		le.PutUint64(b[16:], seed)
		le.PutUint32(b[24:], uint32(pos))
		le.PutUint32(b[28:], uint32(logprobs))
	}
	for i := 0; i < l.Dims.Tokens; i++ {
		var tok, pos int32
		if i < t {
			tok, pos = plan.Tokens[i], plan.Positions[i]
		}
		put32(l.Tokens, i, uint32(tok))
		put32(l.Positions, i, uint32(pos))
	}
	// QueryStart: the plan's, then the padding sequences share the padding tokens.
	for i := 0; i <= b; i++ {
		put32(l.QueryStart, i, uint32(plan.QueryStart[i]))
	}
	if pad := l.Dims.Seqs - b; pad > 0 {
		each := (l.Dims.Tokens - t) / pad
		q := t
		for i := b + 1; i <= l.Dims.Seqs; i++ {
			q += each
			if i == l.Dims.Seqs {
				q = l.Dims.Tokens // the last takes the remainder
			}
			put32(l.QueryStart, i, uint32(q))
		}
	}
	for i := 0; i < l.Dims.Seqs; i++ {
		var n int32
		if i < b {
			n = plan.Computed[i] + plan.Scheduled[i]
		}
		put32(l.CtxLens, i, uint32(n))
	}
	// Logits rows and the sampling row of each one's sequence.
	r := 0
	for i := 0; i < b; i++ {
		for j := plan.LogitsStart[i]; j < plan.LogitsStart[i+1]; j++ {
			idx := plan.LogitsIndices[j]
			put32(l.LogitsIndices, r, uint32(idx))
			putRow(r, plan.Temperature[i], plan.TopP[i], plan.MinP[i], plan.TopK[i], plan.Seed[i], plan.Positions[idx]+1, plan.Logprobs[i])
			r++
		}
	}
	for ; r < l.Dims.Rows; r++ {
		put32(l.LogitsIndices, r, 0)
		putRow(r, 0, 1, 0, 0, 0, 0, -1)
	}
	for g := 0; g < l.Dims.Groups; g++ {
		gp := &plan.Groups[g]
		for i := 0; i < l.Dims.Tokens; i++ {
			s := engine.NoSlot
			if i < t {
				s = gp.SlotMapping[i]
			}
			put64(l.Slots[g], i, uint64(s))
		}
		n := int(gp.PageTableStart[b])
		for i := 0; i <= l.Dims.Seqs; i++ {
			put32(l.PageTableStart[g], i, uint32(gp.PageTableStart[min(i, b)]))
		}
		for j := 0; j < l.Dims.Seqs*l.Dims.PagesPerSeq; j++ {
			var id uint32
			if j < n {
				id = uint32(gp.PageTable[j])
			}
			put32(l.PageTable[g], j, id)
		}
	}
	return nil
}

package gpurunner

import (
	"bytes"
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/kvslab"
)

// TestSampleRowBytes: the plan upload stores cuda.SampleParams as its Go struct, which must
// be the bytes cuda.PutSampleParams encodes for the kernel.
func TestSampleRowBytes(t *testing.T) {
	if unsafe.Sizeof(cuda.SampleParams{}) != SampleRowBytes {
		t.Fatalf("cuda.SampleParams is %d bytes, the sampling kernel reads rows of %d", unsafe.Sizeof(cuda.SampleParams{}), SampleRowBytes)
	}
	p := cuda.SampleParams{Temperature: 0.7, TopP: 0.9, MinP: 0.05, TopK: 40, Seed: 0x0102030405060708, Pos: 17, Logprobs: 3}
	want := make([]byte, SampleRowBytes)
	if _, err := cuda.PutSampleParams(want, []cuda.SampleParams{p}); err != nil {
		t.Fatal(err)
	}
	got := unsafe.Slice((*byte)(unsafe.Pointer(&p)), SampleRowBytes)
	if !bytes.Equal(got, want) {
		t.Errorf("cuda.SampleParams in memory % x, the kernel's encoding % x", got, want)
	}
}

func TestPlanLayoutOffsets(t *testing.T) {
	l, err := NewPlanLayout(Dims{Tokens: 5, Seqs: 2, Rows: 2, PagesPerSeq: 3, Groups: 1})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name string
		got  Section
		off  int64
		n    int64
	}{
		{"Tokens", l.Tokens, 0, 20}, {"Positions", l.Positions, 32, 20}, {"QueryStart", l.QueryStart, 64, 12},
		{"CtxLens", l.CtxLens, 80, 8}, {"LogitsIndices", l.LogitsIndices, 96, 8}, {"Sampling", l.Sampling, 112, 64},
		{"MaskStart", l.MaskStart, 176, 8}, {"Slots[0]", l.Slots[0], 192, 40}, {"PageTableStart[0]", l.PageTableStart[0], 240, 12},
		{"PageTable[0]", l.PageTable[0], 256, 24},
	}
	for _, w := range want {
		if w.got.Off != w.off || w.got.Len != w.n {
			t.Errorf("%s at %d (+%d), want %d (+%d)", w.name, w.got.Off, w.got.Len, w.off, w.n)
		}
	}
	if l.Size != 288 {
		t.Errorf("size %d, want 288", l.Size)
	}
}

func TestPlanLayoutAlignedAndDisjoint(t *testing.T) {
	for _, d := range []Dims{
		{Tokens: 1, Seqs: 1, Rows: 1, PagesPerSeq: 1, Groups: 1},
		{Tokens: 8192, Seqs: 257, Rows: 256, PagesPerSeq: 256, Groups: 1},
		{Tokens: 7, Seqs: 3, Rows: 5, PagesPerSeq: 9, Groups: 3},
		{Tokens: 3, Seqs: 3, Rows: 0, PagesPerSeq: 0, Groups: 0},
	} {
		l, err := NewPlanLayout(d)
		if err != nil {
			t.Fatal(err)
		}
		secs := append([]Section{l.Tokens, l.Positions, l.QueryStart, l.CtxLens, l.LogitsIndices, l.Sampling, l.MaskStart}, append(append(l.Slots, l.PageTableStart...), l.PageTable...)...)
		slices.SortFunc(secs, func(a, b Section) int { return int(a.Off - b.Off) })
		for i, s := range secs {
			if s.Off%sectionAlign != 0 {
				t.Errorf("%+v: section at %d is not %d-byte aligned", d, s.Off, sectionAlign)
			}
			if i > 0 && secs[i-1].Off+secs[i-1].Len > s.Off {
				t.Errorf("%+v: sections %+v and %+v overlap", d, secs[i-1], s)
			}
			if s.Off+s.Len > l.Size {
				t.Errorf("%+v: section %+v past the size %d", d, s, l.Size)
			}
		}
	}
	for _, d := range []Dims{{Tokens: 0, Seqs: 1}, {Tokens: 1, Seqs: 0}, {Tokens: 1, Seqs: 1, Rows: -1}} {
		if _, err := NewPlanLayout(d); err == nil {
			t.Errorf("%+v: no error", d)
		}
	}
}

// unpacked reads a packed upload back.
type unpacked struct {
	tokens, positions, queryStart, ctxLens, logits []int32
	sampling                                       []cuda.SampleParams
	slots                                          []int64
	pages                                          []uint32
	pageStart                                      []int32
	maskStart                                      []int32
}

func unpack(l *PlanLayout, buf []byte) unpacked {
	le := binary.LittleEndian
	i32 := func(s Section) []int32 {
		out := make([]int32, s.Len/4)
		for i := range out {
			out[i] = int32(le.Uint32(buf[s.Off+int64(i)*4:]))
		}
		return out
	}
	u := unpacked{
		tokens: i32(l.Tokens), positions: i32(l.Positions), queryStart: i32(l.QueryStart), ctxLens: i32(l.CtxLens),
		logits: i32(l.LogitsIndices), maskStart: i32(l.MaskStart),
	}
	for i := int64(0); i < l.Sampling.Len/SampleRowBytes; i++ {
		b := buf[l.Sampling.Off+i*SampleRowBytes:]
		u.sampling = append(u.sampling, cuda.SampleParams{
			Temperature: math.Float32frombits(le.Uint32(b[0:])), TopP: math.Float32frombits(le.Uint32(b[4:])),
			MinP: math.Float32frombits(le.Uint32(b[8:])), TopK: int32(le.Uint32(b[12:])), Seed: le.Uint64(b[16:]),
			Pos: int32(le.Uint32(b[24:])), Logprobs: int32(le.Uint32(b[28:])),
		})
	}
	for i := int64(0); i < l.Slots[0].Len/8; i++ {
		u.slots = append(u.slots, int64(le.Uint64(buf[l.Slots[0].Off+i*8:])))
	}
	u.pageStart = i32(l.PageTableStart[0])
	for i := int64(0); i < l.PageTable[0].Len/4; i++ {
		u.pages = append(u.pages, le.Uint32(buf[l.PageTable[0].Off+i*4:]))
	}
	return u
}

func eq[T comparable](t *testing.T, name string, got, want []T) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s = %v, want %v", name, got, want)
	}
}

func TestPackDecodePadsToBucket(t *testing.T) {
	// Three sequences decode with 4 tokens of page size, packed into a bucket of 4.
	p := buildPlan(4,
		seqSpec{computed: 5, promptLen: 2, tokens: []int32{11}, pages: []kvslab.PageID{7, 8}, rows: 1, temp: 0.5, topP: 0.9, topK: 40, minP: 0.1, seed: 99},
		seqSpec{computed: 1, promptLen: 1, tokens: []int32{12}, pages: []kvslab.PageID{1<<16 | 3}, rows: 1},
		seqSpec{computed: 8, promptLen: 3, tokens: []int32{13}, pages: []kvslab.PageID{4, 5, 6}, rows: 1},
	)
	p.GraphBatch = 4
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	bk := Buckets{Decode: []int{1, 2, 4}, MaxPages: 4, Groups: 1}
	sh := bk.Choose(p, 8)
	if sh.Mode != DecodeGraph || sh.Dims != (Dims{Tokens: 4, Seqs: 4, Rows: 4, PagesPerSeq: 4, Groups: 1}) {
		t.Fatalf("shape %+v, want the decode graph of 4", sh)
	}
	l, err := NewPlanLayout(sh.Dims)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, l.Size)
	for i := range buf {
		buf[i] = 0xAB // stale bytes of the previous step: Pack must overwrite every one read
	}
	if err := l.Pack(buf, p); err != nil {
		t.Fatal(err)
	}
	u := unpack(&l, buf)
	eq(t, "tokens", u.tokens, []int32{11, 12, 13, 0})
	eq(t, "positions", u.positions, []int32{5, 1, 8, 0})
	eq(t, "queryStart", u.queryStart, []int32{0, 1, 2, 3, 4})
	eq(t, "ctxLens", u.ctxLens, []int32{6, 2, 9, 0})
	eq(t, "logits", u.logits, []int32{0, 1, 2, 0})
	eq(t, "slots", u.slots, []int64{8*4 + 1, (1<<16|3)*4 + 1, 6 * 4, -1})
	eq(t, "pageStart", u.pageStart, []int32{0, 2, 3, 6, 6})
	eq(t, "pages", u.pages[:6], []uint32{7, 8, 1<<16 | 3, 4, 5, 6}) // the rest is never read
	eq(t, "sampling", u.sampling, []cuda.SampleParams{
		{Temperature: 0.5, TopP: 0.9, MinP: 0.1, TopK: 40, Seed: 99, Pos: 6, Logprobs: -1},
		{TopP: 1, Pos: 2, Logprobs: -1}, {TopP: 1, Pos: 9, Logprobs: -1}, {TopP: 1, Logprobs: -1},
	})
	// The rows are the sampling kernel's own encoding.
	want := make([]byte, cuda.SampleParamsBytes*4)
	if _, err := cuda.PutSampleParams(want, u.sampling); err != nil {
		t.Fatal(err)
	}
	if got := buf[l.Sampling.Off : l.Sampling.Off+l.Sampling.Len]; !slices.Equal(got, want) {
		t.Errorf("sampling rows differ from cuda.PutSampleParams' encoding:\n%x\n%x", got, want)
	}
}

func TestPackPrefillPadsIntoOneSequence(t *testing.T) {
	// A 5-token prompt and a decode row in the 16-token prefill graph.
	p := buildPlan(4,
		seqSpec{computed: 0, tokens: []int32{1, 2, 3, 4, 5}, pages: []kvslab.PageID{2, 3}, rows: 1},
		seqSpec{computed: 3, promptLen: 2, tokens: []int32{9}, pages: []kvslab.PageID{4}, rows: 1},
	)
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	bk := Buckets{Decode: []int{1, 2}, Prefill: []int{16, 32}, MaxPages: 2, Groups: 1}
	sh := bk.Choose(p, 4)
	want := Dims{Tokens: 16, Seqs: 5, Rows: 4, PagesPerSeq: 2, Groups: 1} // 4 sequences at most, and a padding one
	if sh.Mode != PrefillGraph || sh.Dims != want {
		t.Fatalf("shape %+v, want the prefill graph %+v", sh, want)
	}
	l, _ := NewPlanLayout(sh.Dims)
	buf := make([]byte, l.Size)
	if err := l.Pack(buf, p); err != nil {
		t.Fatal(err)
	}
	u := unpack(&l, buf)
	// 10 padding tokens over 3 padding sequences: 3 each, the last one the remainder.
	eq(t, "queryStart", u.queryStart, []int32{0, 5, 6, 9, 12, 16})
	eq(t, "ctxLens", u.ctxLens, []int32{5, 4, 0, 0, 0})
	eq(t, "logits", u.logits, []int32{4, 5, 0, 0})
	eq(t, "row positions", []int32{u.sampling[0].Pos, u.sampling[1].Pos, u.sampling[2].Pos}, []int32{5, 4, 0})
	for i := 6; i < 16; i++ {
		if u.slots[i] != engine.NoSlot {
			t.Errorf("padding token %d writes slot %d", i, u.slots[i])
		}
	}
	eq(t, "slots[:6]", u.slots[:6], []int64{8, 9, 10, 11, 12, 4*4 + 3})
	eq(t, "pageStart", u.pageStart, []int32{0, 2, 3, 3, 3, 3})
}

func TestPackRefusesWhatDoesNotFit(t *testing.T) {
	p := decodePlan(3, 5, 4)
	for _, d := range []Dims{
		{Tokens: 2, Seqs: 3, Rows: 3, PagesPerSeq: 2, Groups: 1}, // too few tokens
		{Tokens: 3, Seqs: 3, Rows: 3, PagesPerSeq: 1, Groups: 1}, // page table too narrow
		{Tokens: 3, Seqs: 3, Rows: 2, PagesPerSeq: 2, Groups: 1}, // too few rows
		{Tokens: 3, Seqs: 3, Rows: 3, PagesPerSeq: 2, Groups: 2}, // another group count
		{Tokens: 4, Seqs: 3, Rows: 3, PagesPerSeq: 2, Groups: 1}, // a padding token but no padding sequence
	} {
		l, err := NewPlanLayout(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Pack(make([]byte, l.Size), p); err == nil {
			t.Errorf("%+v: packed a plan of %+v", d, PlanDims(p))
		}
	}
	l, _ := NewPlanLayout(PlanDims(p))
	if err := l.Pack(make([]byte, l.Size-1), p); err == nil {
		t.Error("packed into a buffer below the layout's size")
	}
}

func TestPackAllocatesNothing(t *testing.T) {
	p := decodePlan(32, 100, 16)
	l, _ := NewPlanLayout(Dims{Tokens: 64, Seqs: 64, Rows: 64, PagesPerSeq: 8, Groups: 1})
	buf := make([]byte, l.Size)
	if n := testing.AllocsPerRun(10, func() {
		if err := l.Pack(buf, p); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Pack allocates %.0f times per step", n)
	}
}

func BenchmarkPackDecode256(b *testing.B) {
	p := decodePlan(256, 1000, 16)
	l, _ := NewPlanLayout(Dims{Tokens: 256, Seqs: 256, Rows: 256, PagesPerSeq: 256, Groups: 1})
	buf := make([]byte, l.Size)
	b.ReportAllocs()
	for b.Loop() {
		if err := l.Pack(buf, p); err != nil {
			b.Fatal(err)
		}
	}
}

// TestPackMaskStarts: each logits row's MaskStart is its mask's word offset in the plan's
// TokenMask (a verifying sequence's rows one after another), -1 for an unconstrained
// sequence and the padding rows, whatever the buffer held before; a plan without masks
// gives -1 everywhere.
func TestPackMaskStarts(t *testing.T) {
	const words = 3
	p := buildPlan(4,
		seqSpec{computed: 5, promptLen: 2, tokens: []int32{11}, pages: []kvslab.PageID{7, 8}, rows: 1},
		seqSpec{computed: 1, promptLen: 1, tokens: []int32{12}, pages: []kvslab.PageID{3}, rows: 1},
		seqSpec{computed: 8, promptLen: 3, tokens: []int32{13, 14, 15}, pages: []kvslab.PageID{4, 5, 6}, rows: 3},
		seqSpec{computed: 0, tokens: []int32{1, 2}, pages: []kvslab.PageID{9}, rows: 0},
	)
	l, err := NewPlanLayout(Dims{Tokens: 8, Seqs: 5, Rows: 7, PagesPerSeq: 3, Groups: 1})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, l.Size)
	starts := func() []int32 {
		for i := range buf {
			buf[i] = 0xAB
		}
		if err := l.Pack(buf, p); err != nil {
			t.Fatal(err)
		}
		return unpack(&l, buf).maskStart
	}
	eq(t, "mask starts without masks", starts(), []int32{-1, -1, -1, -1, -1, -1, -1})
	// Sequence 0 and 2 are constrained: one mask, then three (its drafts' rows).
	p.TokenMaskStart = []int32{0, words, words, 4 * words, 4 * words}
	p.TokenMask = make([]uint32, 4*words)
	eq(t, "mask starts", starts(), []int32{0, -1, words, 2 * words, 3 * words, -1, -1})
}

// TestPackMasksChecksWidth: a constrained row's mask must be the vocabulary's width, and
// the masks must fit the runner's buffer; a plan without masks uploads none.
func TestPackMasksChecksWidth(t *testing.T) {
	r := &Runner{info: engine.RunnerInfo{VocabSize: 100}} // 4 words per row
	p := buildPlan(4,
		seqSpec{computed: 5, promptLen: 2, tokens: []int32{11}, pages: []kvslab.PageID{7, 8}, rows: 1},
		seqSpec{computed: 1, promptLen: 1, tokens: []int32{12}, pages: []kvslab.PageID{3}, rows: 1},
	)
	buf := make([]byte, 2*4*4)
	if n, err := r.packMasks(buf, p); n != 0 || err != nil {
		t.Fatalf("no masks: %d bytes, %v", n, err)
	}
	p.TokenMaskStart, p.TokenMask = []int32{0, 0, 4}, []uint32{1, 2, 3, 4}
	if n, err := r.packMasks(buf, p); n != 16 || err != nil || viewUint32(buf)[3] != 4 {
		t.Fatalf("one mask: %d bytes, %v", n, err)
	}
	p.TokenMaskStart, p.TokenMask = []int32{0, 0, 3}, []uint32{1, 2, 3}
	if _, err := r.packMasks(buf, p); err == nil || !strings.Contains(err.Error(), "sequence 1 has 3 token mask words for 1 logits rows") {
		t.Errorf("a mask of 3 words: %v", err)
	}
	p.TokenMaskStart, p.TokenMask = []int32{0, 4, 8}, make([]uint32, 8)
	if _, err := r.packMasks(buf[:16], p); err == nil || !strings.Contains(err.Error(), "exceed") {
		t.Errorf("masks past the buffer: %v", err)
	}
}

package gpurunner

import (
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/kvslab"
)

func TestDecodeBuckets(t *testing.T) {
	for _, c := range []struct {
		max  int
		want []int
	}{
		{1, []int{1}},
		{3, []int{1, 2, 3}},
		{8, []int{1, 2, 4, 8}},
		{40, []int{1, 2, 4, 8, 16, 24, 32, 40}},
		{256, []int{1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256}},
		{2000, []int{1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512}},
	} {
		if got := DecodeBuckets(c.max); !slices.Equal(got, c.want) {
			t.Errorf("DecodeBuckets(%d) = %v, want %v", c.max, got, c.want)
		}
	}
	if got := PrefillBuckets(100); !slices.Equal(got, []int{16, 32, 64}) {
		t.Errorf("PrefillBuckets(100) = %v", got)
	}
	if got := PrefillBuckets(8); len(got) != 0 {
		t.Errorf("PrefillBuckets(8) = %v, want none", got)
	}
}

func TestChooseStaysInRoom(t *testing.T) {
	// 3 sequences verifying 2 drafts each (9 tokens) padded to the bucket of 4 would be 12
	// tokens and rows, past a workspace of 10: eager.
	bk := Buckets{Decode: []int{1, 2, 4}, MaxPages: 4, Groups: 1, Room: Dims{Tokens: 10, Seqs: 5, Rows: 10, PagesPerSeq: 4, Groups: 1}}
	p := buildPlan(16,
		seqSpec{computed: 4, promptLen: 2, tokens: []int32{1, 2, 3}, pages: []kvslab.PageID{1}, rows: 3},
		seqSpec{computed: 4, promptLen: 2, tokens: []int32{1, 2, 3}, pages: []kvslab.PageID{2}, rows: 3},
		seqSpec{computed: 4, promptLen: 2, tokens: []int32{1, 2, 3}, pages: []kvslab.PageID{3}, rows: 3})
	p.GraphBatch = 4
	if sh := bk.Choose(p, 4); sh.Mode != Eager || sh.Dims.Tokens != 9 {
		t.Errorf("padded past the room: %+v", sh)
	}
	bk.Room.Tokens, bk.Room.Rows = 12, 12
	if sh := bk.Choose(p, 4); sh.Mode != DecodeGraph || sh.Dims.Tokens != 12 {
		t.Errorf("within the room: %+v", sh)
	}
}

// TestWorkspaceHoldsEveryShape checks, for the workspace of a 1B-class config, that every
// graph shape's upload fits the plan buffer and the decode split the attention kernel
// picks for it (on H100 and H200 SM counts) fits the partials buffer.
func TestWorkspaceHoldsEveryShape(t *testing.T) {
	c := tinyConfig()
	c.Heads, c.KVHeads, c.HeadDim, c.MaxContext = 32, 8, 64, 4096
	c.Hidden = c.Heads * c.HeadDim
	c.RopeCos = make([]float32, c.MaxContext*c.RopeDim/2)
	c.RopeSin = c.RopeCos
	lim := Limits{MaxTokens: 8192, MaxSeqs: 256, MaxRows: 256}
	ws, err := NewWorkspace(c, lim)
	if err != nil {
		t.Fatal(err)
	}
	bk := Buckets{Decode: DecodeBuckets(lim.MaxSeqs), Prefill: PrefillBuckets(lim.MaxTokens), MaxPages: c.MaxPages(), Groups: 1}
	var shapes []Dims
	for _, b := range bk.Decode {
		shapes = append(shapes, bk.DecodeDims(b, 1))
	}
	for _, tk := range bk.Prefill {
		shapes = append(shapes, bk.PrefillDims(tk, lim.MaxSeqs))
	}
	shapes = append(shapes, Dims{Tokens: lim.MaxTokens, Seqs: lim.MaxSeqs, Rows: lim.MaxRows, PagesPerSeq: c.MaxPages(), Groups: 1})
	for _, d := range shapes {
		l, err := NewPlanLayout(d)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Fits(ws.PlanLayout.Dims) || l.Size > ws.Plan.Len {
			t.Errorf("%+v: upload of %d bytes does not fit the plan buffer of %d (%+v)", d, l.Size, ws.Plan.Len, ws.PlanLayout.Dims)
		}
		for _, sms := range []int{132, 144} {
			split, err := cuda.ChooseDecodeSplit(d.Seqs, c.KVHeads, c.MaxContext, sms)
			if err != nil {
				t.Fatal(err)
			}
			if need := cuda.DecodeWorkspaceBytes(d.Seqs, c.Heads, c.HeadDim, split.Parts); need > ws.Partials.Len {
				t.Errorf("%+v on %d SMs: split %+v needs %d bytes of partials, the workspace has %d", d, sms, split, need, ws.Partials.Len)
			}
		}
	}
}

func TestChoose(t *testing.T) {
	bk := Buckets{Decode: DecodeBuckets(64), Prefill: PrefillBuckets(8192), MaxPages: 8, Groups: 1}
	padded := func(n, g int) Shape {
		p := decodePlan(n, 20, 16)
		p.GraphBatch = int32(g)
		return bk.Choose(p, 64)
	}
	// The engine padded 5 decodes to the bucket of 8.
	if sh := padded(5, 8); sh.Mode != DecodeGraph || sh.Dims.Seqs != 8 || sh.Dims.Tokens != 8 || sh.Dims.PagesPerSeq != 8 {
		t.Errorf("5 decodes padded to 8: %+v", sh)
	}
	// A graph batch that is not one of the runner's buckets runs eagerly.
	if sh := padded(5, 6); sh.Mode != Eager || sh.Dims != (Dims{Tokens: 5, Seqs: 5, Rows: 5, PagesPerSeq: 2, Groups: 1}) {
		t.Errorf("graph batch 6: %+v", sh)
	}
	// Without a graph batch a small step takes the smallest prefill graph it fits.
	if sh := padded(5, 0); sh.Mode != PrefillGraph || sh.Dims.Tokens != 16 || sh.Dims.Seqs != 16 {
		t.Errorf("5 decodes without a graph batch: %+v", sh)
	}
	// A prompt of 600 tokens is past the largest prefill graph (512).
	long := buildPlan(16, seqSpec{tokens: make([]int32, 600), pages: make([]kvslab.PageID, 38), rows: 1})
	if sh := bk.Choose(long, 64); sh.Mode != Eager || sh.Dims.Tokens != 600 {
		t.Errorf("600-token prompt: %+v", sh)
	}
	// A sequence longer than the graphs' page tables runs eagerly.
	wide := decodePlan(2, 16*9, 16)
	wide.GraphBatch = 2
	if sh := bk.Choose(wide, 64); sh.Mode != Eager {
		t.Errorf("context of 9 pages with graphs of 8: %+v", sh)
	}
	// Uneven decodes (1 and 2 tokens) never take a decode graph.
	uneven := buildPlan(16,
		seqSpec{computed: 4, promptLen: 2, tokens: []int32{1}, pages: []kvslab.PageID{1}, rows: 1},
		seqSpec{computed: 4, promptLen: 2, tokens: []int32{1, 2}, pages: []kvslab.PageID{2}, rows: 2})
	uneven.GraphBatch = 2
	if sh := bk.Choose(uneven, 64); sh.Mode != Eager {
		t.Errorf("uneven decodes: %+v", sh)
	}
	// A 16-token step of 16 one-token sequences fills the prefill graph of 16 exactly (no
	// padding); with 17 it needs the graph of 32. A graph never has more sequences than
	// tokens.
	if sh := bk.Choose(decodePlan(16, 3, 16), 64); sh.Mode != PrefillGraph || sh.Dims.Tokens != 16 {
		t.Errorf("16 tokens: %+v", sh)
	}
	if sh := bk.Choose(decodePlan(17, 3, 16), 64); sh.Mode != PrefillGraph || sh.Dims.Tokens != 32 || sh.Dims.Seqs != 32 {
		t.Errorf("17 tokens: %+v", sh)
	}
	// 16 sequences of one token each with a cap of 8 sequences per step would not come
	// from the engine; with a cap of 15, the graph of 16 holds 16 sequences, no padding one.
	if sh := bk.Choose(decodePlan(15, 3, 16), 15); sh.Mode != PrefillGraph || sh.Dims.Seqs != 16 {
		t.Errorf("15 tokens, cap 15: %+v", sh)
	}
}

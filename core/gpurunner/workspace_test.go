package gpurunner

import (
	"testing"

	"github.com/resin-llm/resin/core/kernels/cuda"
)

// tinyConfig is a small dense config with a rotary table of the right size.
func tinyConfig() *DenseConfig {
	c := &DenseConfig{Vocab: 1000, Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, Intermediate: 128,
		RMSNormEps: 1e-6, MaxContext: 512, PageTokens: 16, RopeDim: 16}
	c.RopeCos = make([]float32, c.MaxContext*c.RopeDim/2)
	c.RopeSin = make([]float32, c.MaxContext*c.RopeDim/2)
	return c
}

func TestWorkspaceSizing(t *testing.T) {
	c := tinyConfig()
	w, err := NewWorkspace(c, Limits{MaxTokens: 100, MaxSeqs: 10, MaxRows: 20})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{
		"Residual": 100 * 64 * 2, "Normed": 100 * 64 * 2, "QKV": 100 * (64 + 2*32) * 2, "Attn": 100 * 64 * 2,
		"Proj": 100 * 64 * 2, "GateUp": 100 * 256 * 2, "Act": 100 * 128 * 2, "Rows": 20 * 64 * 2,
		"Logits": 20 * 1000 * 4, "Sampled": 20 * 4, "Logprobs": 20 * 4, "TopIDs": 20 * 32 * 4, "TopLogprobs": 20 * 32 * 4,
		"TokenMask": 20 * 32 * 4,               // (1000+31)/32 words per row
		"Partials":  11 * 4 * 2 * (16 + 2) * 4, // 10 sequences and a padding one; 512 tokens of context: 2 splits of 256
		"Plan":      w.PlanLayout.Size,
	}
	var end int64
	for _, s := range w.Sections() {
		if s.Len != want[s.Name] {
			t.Errorf("%s: %d bytes, want %d", s.Name, s.Len, want[s.Name])
		}
		if s.Off%workspaceAlign != 0 || s.Off < end {
			t.Errorf("%s at %d: not %d-aligned or overlapping the previous buffer (ends at %d)", s.Name, s.Off, workspaceAlign, end)
		}
		end = s.Off + s.Len
	}
	if w.Size < end || w.Size-end >= workspaceAlign {
		t.Errorf("size %d for buffers ending at %d", w.Size, end)
	}
	// The plan buffer holds the largest step plus a padding sequence, with full-width page tables.
	if d := w.PlanLayout.Dims; d != (Dims{Tokens: 100, Seqs: 11, Rows: 20, PagesPerSeq: 32, Groups: 1}) {
		t.Errorf("plan dims %+v", d)
	}
	for _, bad := range []Limits{{0, 1, 1}, {10, 0, 1}, {10, 11, 1}, {10, 1, 11}} {
		if _, err := NewWorkspace(c, bad); err == nil {
			t.Errorf("limits %+v: no error", bad)
		}
	}
	c.Hidden = 60 // not a multiple of 8
	if _, err := NewWorkspace(c, Limits{10, 1, 1}); err == nil {
		t.Error("hidden 60: no error")
	}
}

func TestWorkspaceScalesWithLimits(t *testing.T) {
	c := tinyConfig()
	small, _ := NewWorkspace(c, Limits{MaxTokens: 64, MaxSeqs: 8, MaxRows: 8})
	big, _ := NewWorkspace(c, Limits{MaxTokens: 128, MaxSeqs: 8, MaxRows: 8})
	if big.Residual.Len != 2*small.Residual.Len || big.Logits.Len != small.Logits.Len {
		t.Errorf("doubling the tokens: residual %d → %d, logits %d → %d", small.Residual.Len, big.Residual.Len, small.Logits.Len, big.Logits.Len)
	}
}

func TestDenseWeightBytes(t *testing.T) {
	c := tinyConfig()
	// per layer: qkv 64*128 + o 64*64 + mlp 3*64*128 + norms 2*64; embed + head 2*1000*64; final norm 64.
	layer := int64(64*128 + 64*64 + 3*64*128 + 2*64)
	want := 2 * (2*layer + 2*1000*64 + 64)
	if got := c.WeightBytes(); got != want {
		t.Errorf("WeightBytes %d, want %d", got, want)
	}
	c.TiedEmbeddings = true
	if got := c.WeightBytes(); got != want-1000*64*2 {
		t.Errorf("tied: WeightBytes %d, want %d", got, want-1000*64*2)
	}
}

// TestDecodeSplitFitsWorkspace holds the decode split Forward chooses to the partials the
// workspace holds, for every step size up to the padded sequence cap on small and large
// GPUs, and checks that a sliding window sizes the split (partitions past the window
// would only read no key) and the partials (no memory for splits that never run).
func TestDecodeSplitFitsWorkspace(t *testing.T) {
	for _, tc := range []struct {
		name            string
		maxCtx, window  int
		wantMostSplits  int
		wantBatch1Parts int // on 132 SMs
	}{
		{"short context", 512, 0, 2, 2},
		{"long context", 131072, 0, cuda.MaxDecodeParts, cuda.MaxDecodeParts},
		{"window", 131072, 4096, 16, 16},
		{"window longer than the context", 2048, 8192, 8, 8},
	} {
		c := tinyConfig()
		c.MaxContext, c.Window = tc.maxCtx, tc.window
		c.RopeCos = make([]float32, c.MaxContext*c.RopeDim/2)
		c.RopeSin = make([]float32, c.MaxContext*c.RopeDim/2)
		lim := Limits{MaxTokens: 512, MaxSeqs: 64, MaxRows: 64}
		w, err := NewWorkspace(c, lim)
		if err != nil {
			t.Fatal(err)
		}
		if w.Splits != tc.wantMostSplits {
			t.Errorf("%s: workspace for %d splits, want %d", tc.name, w.Splits, tc.wantMostSplits)
		}
		for _, sms := range []int{1, 8, 132, 1000} {
			for b := 1; b <= lim.MaxSeqs+1; b++ {
				split, err := decodeSplit(c, b, sms)
				if err != nil {
					t.Fatal(err)
				}
				if need := cuda.DecodeWorkspaceBytes(b, c.Heads, c.HeadDim, split.Parts); need > w.Partials.Len {
					t.Fatalf("%s: %d sequences on %d SMs: split %+v needs %d bytes of partials, the workspace has %d",
						tc.name, b, sms, split, need, w.Partials.Len)
				}
				keys := c.MaxContext
				if c.Window > 0 {
					keys = min(keys, c.Window)
				}
				if split.Parts > 1 && (split.Parts-1)*split.PartLen >= keys {
					t.Errorf("%s: %d sequences: split %+v has a partition past the %d keys a query reads", tc.name, b, split, keys)
				}
			}
		}
		if split, _ := decodeSplit(c, 1, 132); split.Parts != tc.wantBatch1Parts {
			t.Errorf("%s: batch 1 on 132 SMs split %+v, want %d parts", tc.name, split, tc.wantBatch1Parts)
		}
	}
}

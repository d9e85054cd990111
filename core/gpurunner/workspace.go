package gpurunner

import (
	"fmt"

	"github.com/resin-llm/resin/core/kernels/cuda"
)

// workspaceAlign is the byte alignment of every workspace buffer: cuBLASLt and the
// vectorised kernels read 16-byte-aligned rows, and 256 keeps each buffer on its own
// cache lines.
const workspaceAlign = 256

// Limits are the most a step holds: the engine's token budget and sequence cap, and the
// logits rows (a sequence that verifies k drafts has 1+k).
type Limits struct {
	MaxTokens int
	MaxSeqs   int
	MaxRows   int
}

// String names the limits (the ranks of a group agree on it: gpurunner.AgreeLayout).
func (l Limits) String() string {
	return fmt.Sprintf("%d sequences, %d rows a step, %d logits rows", l.MaxSeqs, l.MaxTokens, l.MaxRows)
}

// Check reports a limit the workspace cannot be sized for.
func (l Limits) Check() error {
	if l.MaxTokens <= 0 || l.MaxSeqs <= 0 || l.MaxRows <= 0 {
		return fmt.Errorf("gpurunner: limits %+v must be positive", l)
	}
	if l.MaxSeqs > l.MaxTokens || l.MaxRows > l.MaxTokens {
		return fmt.Errorf("gpurunner: limits %+v: sequences and logits rows are at most the tokens", l)
	}
	return nil
}

// MaxTop is the most logprob alternatives a row samples on the device
// (cuda.MaxSampleTop).
const MaxTop = 32

// decodeSplitTokens is the fewest context tokens one split of the split-K decode
// attention covers (core/kernels/cuda's minDecodePart); the workspace holds a partial
// result per split.
const decodeSplitTokens = 256

// maxDecodeSplits is the most splits decodeSplit gives a step of c: one per
// decodeSplitTokens keys a query reads (its window when shorter than the context), and
// no more than the kernel's cuda.MaxDecodeParts.
func maxDecodeSplits(c *DenseConfig) int {
	keys := c.MaxContext
	if c.Window > 0 {
		keys = min(keys, c.Window)
	}
	return max(1, min((keys+decodeSplitTokens-1)/decodeSplitTokens, cuda.MaxDecodeParts))
}

// Workspace is the device memory a dense model's step uses besides its weights and its
// cache, carved once from one allocation sized for the limits: no step allocates.
// Activations are bf16, logits and attention partials float32.
//
//	Residual  [T, hidden]        bf16  the residual stream
//	Normed    [T, hidden]        bf16  RMSNorm output, the GEMMs' input
//	QKV       [T, q+2kv]         bf16  fused projection output (rotated in place)
//	Attn      [T, q]             bf16  attention output
//	Proj      [T, hidden]        bf16  o_proj / down_proj output, added into Residual
//	GateUp    [T, 2·inter]       bf16  gate and up projections
//	Act       [T, inter]         bf16  SiLU(gate)·up
//	Rows      [R, hidden]        bf16  the logits rows, gathered and normed
//	Logits    [R, vocab]         f32
//	Sampled     [R]              i32   sampled token ids
//	Logprobs    [R]              f32   their logprobs
//	TopIDs      [R, 32]          i32   top logprob alternatives (cuda.MaxSampleTop)
//	TopLogprobs [R, 32]          f32
//	TokenMask   [R, (vocab+31)/32] u32 the step's grammar token masks (BatchPlan.TokenMask,
//	                                   uploaded as it is; PlanLayout.MaskStart indexes it)
//	Partials  [B+1, heads, S, d+2] f32 split-K decode partials (S splits of at least 256
//	                                   keys of the context or window, at most 64)
//	Plan      PlanLayout of the limits: the step's inputs, uploaded per step
type Workspace struct {
	Residual, Normed, QKV, Attn, Proj, GateUp, Act, Rows Section
	Logits, Sampled, Logprobs, TopIDs, TopLogprobs       Section
	TokenMask                                            Section
	Partials, Plan                                       Section
	Splits                                               int // most decode splits of a step (maxDecodeSplits)
	PlanLayout                                           PlanLayout
	Size                                                 int64
}

// NewWorkspace sizes the workspace of config c for limits l.
func NewWorkspace(c *DenseConfig, l Limits) (Workspace, error) {
	if err := c.Check(); err != nil {
		return Workspace{}, err
	}
	if err := l.Check(); err != nil {
		return Workspace{}, err
	}
	pl, err := NewPlanLayout(Dims{Tokens: l.MaxTokens, Seqs: l.MaxSeqs + 1, Rows: l.MaxRows, PagesPerSeq: c.MaxPages(), Groups: 1})
	if err != nil {
		return Workspace{}, err
	}
	w := Workspace{PlanLayout: pl, Splits: maxDecodeSplits(c)}
	t, r := int64(l.MaxTokens), int64(l.MaxRows)
	var off int64
	next := func(bytes int64) Section {
		s := Section{Off: off, Len: bytes}
		off += (bytes + workspaceAlign - 1) / workspaceAlign * workspaceAlign
		return s
	}
	const bf16, f32 = 2, 4
	w.Residual = next(t * int64(c.Hidden) * bf16)
	w.Normed = next(t * int64(c.Hidden) * bf16)
	w.QKV = next(t * int64(c.QKVDim()) * bf16)
	w.Attn = next(t * int64(c.QDim()) * bf16)
	w.Proj = next(t * int64(c.Hidden) * bf16)
	w.GateUp = next(t * 2 * int64(c.Intermediate) * bf16)
	w.Act = next(t * int64(c.Intermediate) * bf16)
	w.Rows = next(r * int64(c.Hidden) * bf16)
	w.Logits = next(r * int64(c.Vocab) * f32)
	w.Sampled = next(r * 4)
	w.Logprobs = next(r * f32)
	w.TopIDs = next(r * MaxTop * 4)
	w.TopLogprobs = next(r * MaxTop * f32)
	w.TokenMask = next(r * int64(cuda.MaskWords(c.Vocab)) * 4)
	// A prefill graph adds a padding sequence to the engine's most.
	w.Partials = next(int64(l.MaxSeqs+1) * int64(c.Heads) * int64(w.Splits) * int64(c.HeadDim+2) * f32)
	w.Plan = next(pl.Size)
	w.Size = off
	return w, nil
}

// Sections lists the workspace's buffers by name, in address order.
func (w *Workspace) Sections() []struct {
	Name string
	Section
} {
	return []struct {
		Name string
		Section
	}{
		{"Residual", w.Residual}, {"Normed", w.Normed}, {"QKV", w.QKV}, {"Attn", w.Attn}, {"Proj", w.Proj},
		{"GateUp", w.GateUp}, {"Act", w.Act}, {"Rows", w.Rows}, {"Logits", w.Logits}, {"Sampled", w.Sampled},
		{"Logprobs", w.Logprobs}, {"TopIDs", w.TopIDs}, {"TopLogprobs", w.TopLogprobs}, {"TokenMask", w.TokenMask}, {"Partials", w.Partials}, {"Plan", w.Plan},
	}
}

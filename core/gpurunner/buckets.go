package gpurunner

import (
	"fmt"

	"github.com/resin-llm/resin/core/engine"
)

// Mode says how a step runs.
type Mode int

// Modes of a step.
const (
	// Eager launches every kernel of the step, for the plan's own sizes.
	Eager Mode = iota
	// DecodeGraph replays the graph captured for a decode batch bucket.
	DecodeGraph
	// PrefillGraph replays the graph captured for a prefill token-count bucket.
	PrefillGraph
)

func (m Mode) String() string {
	switch m {
	case Eager:
		return "eager"
	case DecodeGraph:
		return "decode-graph"
	case PrefillGraph:
		return "prefill-graph"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// Shape is how one step runs: its mode and the sizes its upload and kernels are laid out
// for (the plan's own for Eager, the bucket's for a graph).
type Shape struct {
	Mode Mode
	Dims Dims
}

// Buckets are the CUDA-graph shapes a runner captures: decode graphs per batch size (the
// RunnerInfo.GraphBuckets the engine pads decode batches to) and prefill graphs per token
// count. MaxPages is every graph's page-table width (the pages of the longest context), so
// a graph serves any context length.
type Buckets struct {
	Decode   []int // ascending batch sizes
	Prefill  []int // ascending token counts
	MaxPages int
	Groups   int
	// Room, when set, is the largest upload the workspace holds: a graph shape beyond it
	// (a padded batch of drafting sequences past the token budget, say) runs eagerly.
	Room Dims
}

// DecodeBuckets returns the decode batch sizes worth a graph for batches up to maxSeqs
// (and at most 512): 1, 2, 4, 8, then steps of 8 to 32, of 16 to 128, of 32 to 256 and of
// 64 beyond, ending with maxSeqs itself. Finer steps at small sizes keep the padding, and
// so the wasted work, small where a step is cheapest.
func DecodeBuckets(maxSeqs int) []int {
	top := min(maxSeqs, 512)
	var out []int
	for b := 1; b <= top; {
		out = append(out, b)
		switch {
		case b < 8:
			b *= 2
		case b < 32:
			b += 8
		case b < 128:
			b += 16
		case b < 256:
			b += 32
		default:
			b += 64
		}
	}
	if top > 0 && out[len(out)-1] != top {
		out = append(out, top)
	}
	return out
}

// PrefillBuckets returns the token counts worth a prefill graph for steps up to maxTokens
// tokens: powers of two from 16 to 512. Larger prefills are bound by their GEMMs, where
// launch overhead no longer shows, and run eagerly.
func PrefillBuckets(maxTokens int) []int {
	var out []int
	for t := 16; t <= min(maxTokens, 512); t *= 2 {
		out = append(out, t)
	}
	return out
}

// prefillSeqs is the sequence capacity of the prefill graph of t tokens: every real
// sequence of a step that fits plus one padding sequence for the padding tokens, and no
// more sequences than tokens (the attention kernels take none without a query).
func prefillSeqs(t, maxSeqs int) int { return min(t, maxSeqs+1) }

// DecodeDims is the upload of the decode graph of batch b with q tokens per sequence
// (1 + drafts).
func (bk *Buckets) DecodeDims(b, q int) Dims {
	return Dims{Tokens: b * q, Seqs: b, Rows: b * q, PagesPerSeq: bk.MaxPages, Groups: bk.Groups}
}

// PrefillDims is the upload of the prefill graph of t tokens: a logits row for each real
// sequence it can hold.
func (bk *Buckets) PrefillDims(t, maxSeqs int) Dims {
	s := prefillSeqs(t, maxSeqs)
	return Dims{Tokens: t, Seqs: s, Rows: min(s, maxSeqs), PagesPerSeq: bk.MaxPages, Groups: bk.Groups}
}

// Choose returns how plan runs: the decode graph of plan.GraphBatch when the engine padded
// the step to one of the decode buckets, else the smallest prefill graph the plan fits,
// else eagerly at the plan's own sizes. maxSeqs is the engine's sequence cap.
func (bk *Buckets) Choose(plan *engine.BatchPlan, maxSeqs int) Shape {
	sh := bk.choose(plan, maxSeqs)
	if sh.Mode != Eager && bk.Room != (Dims{}) && !sh.Dims.Fits(bk.Room) {
		return Shape{Mode: Eager, Dims: PlanDims(plan)}
	}
	return sh
}

func (bk *Buckets) choose(plan *engine.BatchPlan, maxSeqs int) Shape {
	pd := PlanDims(plan)
	eager := Shape{Mode: Eager, Dims: pd}
	if pd.Seqs == 0 || pd.PagesPerSeq > bk.MaxPages || pd.Groups != bk.Groups {
		return eager
	}
	if g := int(plan.GraphBatch); g > 0 {
		q := int(plan.Scheduled[0])
		for _, s := range plan.Scheduled {
			if int(s) != q {
				return eager
			}
		}
		for _, b := range bk.Decode {
			if b == g {
				if d := bk.DecodeDims(g, q); pd.Fits(d) {
					return Shape{Mode: DecodeGraph, Dims: d}
				}
				return eager
			}
		}
		return eager
	}
	t, ok := engine.PickBucket(bk.Prefill, pd.Tokens)
	if !ok {
		return eager
	}
	d := bk.PrefillDims(t, maxSeqs)
	// The padding tokens need a padding sequence to belong to.
	if pd.Fits(d) && (pd.Seqs < d.Seqs || pd.Tokens == t) {
		return Shape{Mode: PrefillGraph, Dims: d}
	}
	return eager
}

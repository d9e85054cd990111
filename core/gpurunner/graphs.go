package gpurunner

import "github.com/resin-llm/resin/core/cudart"

// GraphKey names the CUDA graph of a shape in a cudart.GraphCache: a decode graph by its
// batch bucket, with the tokens per sequence (1 + drafts) as the variant; a prefill graph
// by its token bucket. ok is false for an Eager shape, which has no graph.
func GraphKey(sh Shape) (k cudart.GraphKey, ok bool) {
	switch sh.Mode {
	case DecodeGraph:
		return cudart.GraphKey{Kind: cudart.GraphDecode, Bucket: sh.Dims.Seqs, Variant: sh.Dims.Tokens / sh.Dims.Seqs}, true
	case PrefillGraph:
		return cudart.GraphKey{Kind: cudart.GraphPrefill, Bucket: sh.Dims.Tokens}, true
	}
	return cudart.GraphKey{}, false
}

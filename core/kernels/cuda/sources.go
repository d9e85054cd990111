// Package cuda holds Resin's shared CUDA kernels as .cu sources embedded in the binary,
// with typed Go launchers. Each kernel's specification is its counterpart in
// core/kernels/ref (device sampling's is core/engine's Sampler).
//
// The float32 kernels are the reference variants: RMSNorm, rotary embeddings, SiLU-and-mul,
// softmax, embedding gather, paged GQA attention, MoE top-k routing and argmax. The GPU
// runner's path is bf16 (computed in float32):
//
//	AddRMSNorm, RMSNormBF16     fused residual add + RMSNorm (add_rmsnorm.cu)
//	RopeKV                      rotary (NeoX or GPT-J) + K/V written to kvslab pages by slot (rope_kv.cu)
//	SiLUMulBF16, EmbeddingBF16  (silu_mul.cu, embedding.cu)
//	AddBiasBF16, HeadRMSNormBF16  q/k/v and o biases, per-head q/k RMSNorm (bias_headnorm.cu)
//	PrefillAttention            ragged paged attention: prompts, chunks, decode rows in one launch
//	DecodeAttention             split-K paged decode, a GQA group per block, LSE reduce (flash_attention.cu)
//	Sample                      greedy/temperature/top-k/top-p/min-p, seeded, logprobs (sampling.cu)
//	VerifyDrafts                speculative drafts accepted against the sampled rows (verify.cu)
//	FP8Quant, FP8Gemm           e4m3 activations per 128 columns, block-scaled FP8 GEMM (quant_linear.cu)
//	MXFP4Gemm, CastBF16         W4A16 over packed MXFP4 experts (masked layout), float32 → bf16
//
// Launchers check shapes and build a launch on the host (grid, block, parameters) in a
// buffer each kernel reuses, so a launch allocates nothing; tests check the packed
// parameters against each kernel's C signature without a GPU.
//
// The sources include prelude.cuh, Resin's own header that lets the same text compile
// under NVRTC (production, through core/cudart) and under clang-16 (scripts/check-kernels.sh).
package cuda

import (
	"embed"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/resin-llm/resin/core/cudart"
)

//go:embed *.cu prelude.cuh
var files embed.FS

// Prelude is the text of prelude.cuh.
func Prelude() string {
	b, err := files.ReadFile("prelude.cuh")
	if err != nil {
		panic("cuda: prelude.cuh missing from the embedded sources") // impossible: go:embed checks it
	}
	return string(b)
}

// Names lists the kernel sources (file names ending in .cu), sorted.
func Names() []string {
	ents, _ := files.ReadDir(".")
	var names []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".cu") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names
}

// Source returns the source of a .cu file with its #include "prelude.cuh" replaced by
// the prelude's text (InlinePrelude), ready for NVRTC (which has no include path to it).
func Source(name string) (string, error) {
	b, err := files.ReadFile(name)
	if err != nil {
		return "", fmt.Errorf("cuda: no kernel source %q", name)
	}
	return InlinePrelude(string(b), name), nil
}

// rePreludeInclude matches the line that includes the prelude, as kernelcheck.Load does.
var rePreludeInclude = regexp.MustCompile(`(?m)^[ \t]*#[ \t]*include[ \t]+"prelude\.cuh"[ \t]*$`)

// InlinePrelude returns src, the text of the kernel source file, with its first
// #include "prelude.cuh" line replaced by the prelude between #line directives
// (cudart.InlineHeader), so that NVRTC reports errors at the file's own line numbers. A
// model's kernels load their sources through it as the core's do.
func InlinePrelude(src, file string) string {
	loc := rePreludeInclude.FindStringIndex(src)
	if loc == nil {
		return src
	}
	line := strings.Count(src[:loc[0]], "\n") + 1
	return src[:loc[0]] + cudart.InlineHeader(Prelude(), "prelude.cuh", file, line) + src[loc[1]:]
}

// Options are the NVRTC options every kernel compiles with.
var Options = []string{"--std=c++17", "-lineinfo"}

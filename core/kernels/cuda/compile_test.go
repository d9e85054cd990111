package cuda

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/kernels/kernelcheck"
)

// wantKernels lists the entry points each source must define.
var wantKernels = map[string][]string{
	"add_rmsnorm.cu":     {"resin_add_rmsnorm_f32", "resin_add_rmsnorm_bf16", "resin_rmsnorm_bf16"},
	"argmax.cu":          {"resin_argmax"},
	"bias_headnorm.cu":   {"resin_add_bias_bf16", "resin_head_rmsnorm_bf16"},
	"embedding.cu":       {"resin_embedding", "resin_embedding_bf16"},
	"flash_attention.cu": {"resin_prefill_attention_bf16", "resin_decode_attention_bf16", "resin_decode_reduce_bf16"},
	"mhc.cu":             {"resin_mhc_pre_f32", "resin_mhc_post_f32"},
	"moe_masked.cu": {"resin_moe_route_f32", "resin_moe_masked_layout", "resin_moe_gather_f32",
		"resin_swiglu_clamped_f32", "resin_moe_combine_f32", "resin_moe_mask_rows"},
	"moe_topk.cu":        {"resin_moe_topk"},
	"paged_attention.cu": {"resin_paged_attention"},
	"quant_linear.cu": {"resin_fp8_quant_f32", "resin_fp8_quant_bf16", "resin_fp8_block_gemm_f32", "resin_fp8_block_gemm_bf16",
		"resin_mxfp4_gemm_f32", "resin_mxfp4_gemm_bf16", "resin_cast_bf16"},
	"rmsnorm.cu":  {"resin_rmsnorm"},
	"rope_kv.cu":  {"resin_rope_kv_f32", "resin_rope_kv_bf16"},
	"rotary.cu":   {"resin_rope_neox", "resin_rope_interleaved"},
	"sampling.cu": {"resin_sample"},
	"silu_mul.cu": {"resin_silu_mul", "resin_silu_mul_split", "resin_silu_mul_bf16"},
	"softmax.cu":  {"resin_softmax"},
	"verify.cu":   {"resin_verify_drafts"},
}

// checkOptions are how the kernels compile: the prelude included, the core's flags.
func checkOptions() kernelcheck.Options {
	return kernelcheck.Options{
		Flags:    Options,
		Includes: map[string]string{"prelude.cuh": Prelude()},
		Entries:  wantKernels,
	}
}

func TestSourcesListed(t *testing.T) {
	names := Names()
	if len(names) != len(wantKernels) {
		t.Fatalf("sources %v, want the %d of wantKernels", names, len(wantKernels))
	}
	for _, n := range names {
		src, err := Source(n)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(src, `#include "prelude.cuh"`) || !strings.Contains(src, "RESIN_PRELUDE") {
			t.Errorf("%s: prelude not inlined", n)
		}
		for _, k := range wantKernels[n] {
			if !strings.Contains(src, "RESIN_KERNEL void "+k+"(") {
				t.Errorf("%s: no kernel %s", n, k)
			}
		}
		// The check compiles exactly what the launchers load.
		if got, err := kernelcheck.Load(files, n, checkOptions().Includes); err != nil || got != src {
			t.Errorf("%s: kernelcheck.Load differs from Source (%v)", n, err)
		}
	}
	if _, err := Source("nope.cu"); err == nil {
		t.Error("a missing source gave no error")
	}
}

// TestCompileAllKernels compiles every kernel for each architecture of
// kernelcheck.Arches (sm_90a: H100/H200; sm_100a: B200) with NVRTC through core/cudart
// (both the cubin the runtime loads and PTX), stores them through a fresh kernel cache,
// reads them back, and assembles the PTX with ptxas -v, logging registers, spills and
// shared memory per kernel and failing on any spill. No GPU is needed.
func TestCompileAllKernels(t *testing.T) {
	for _, arch := range kernelcheck.Arches {
		t.Run(arch, func(t *testing.T) {
			cache, err := cudart.OpenKernelCache(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			o := checkOptions()
			o.Cache, o.Arch = cache, arch
			results := kernelcheck.TestNVRTC(t, files, Names(), o)
			for _, r := range results {
				if r.Source == "flash_attention.cu" {
					checkValueTilesAligned(t, arch, r.PTX)
				}
				for _, k := range r.Kernels {
					if k.Spills() || k.Stack != 0 {
						t.Errorf("%s %s: %d bytes spilled (stores), %d (loads), stack frame %d", arch, k.Name, k.SpillStores, k.SpillLoads, k.Stack)
					}
				}
			}
			// The launchers' own path finds the cubins the check stored: no new entries.
			for _, n := range Names() {
				src, _ := Source(n)
				if _, err := cudart.CompileCached(cache, src, n, arch, Options...); err != nil {
					t.Fatal(err)
				}
			}
			if entries, _ := cache.List(); len(entries) != 2*len(Names()) {
				t.Errorf("kernel cache holds %d entries, want %d (a cubin and a PTX per kernel)", len(entries), 2*len(Names()))
			}
		})
	}
}

// TestClangCompilesEveryKernel is the second opinion: clang-16 compiles each source to PTX
// for sm_90 with no CUDA headers or libdevice, through the same prelude.
func TestClangCompilesEveryKernel(t *testing.T) {
	kernelcheck.TestClang(t, files, Names(), checkOptions())
}

// checkValueTilesAligned checks, in flash_attention.cu's PTX, that the value tiles
// (shared arrays vs), which resin_fa_load_tile writes 16 bytes at a time (st.shared.v4),
// are declared 16-byte aligned: an array of unsigned is only promised 4, and where
// ptxas happens to place it off 16 bytes the store faults with a misaligned address.
func checkValueTilesAligned(t *testing.T, arch string, ptx []byte) {
	t.Helper()
	decls := regexp.MustCompile(`\.shared \.align (\d+) \.b8 (\S*E2vs)\[`).FindAllSubmatch(ptx, -1)
	if len(decls) != 2 {
		t.Errorf("%s: flash_attention.cu's PTX declares %d value tiles, want 2 (prefill and decode)", arch, len(decls))
	}
	for _, d := range decls {
		if string(d[1]) != "16" {
			t.Errorf("%s: shared %s is %s-byte aligned; its 16-byte stores need 16", arch, d[2], d[1])
		}
	}
	if !bytes.Contains(ptx, []byte("st.shared.v4")) {
		t.Errorf("%s: flash_attention.cu stores no tile 16 bytes at a time: is resin_fa_load_tile's vector path gone?", arch)
	}
}

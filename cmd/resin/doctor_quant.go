package main

import (
	"fmt"
	"io"

	"github.com/resin-llm/resin/core/cudart"
)

// doctorQuantLinears reports, per GPU, the path the GPU runners' packed checkpoint weights
// take (core/gpurunner's Linears): FP8 e4m3 linears with 128×128 scales through cuBLASLt's
// block-scaled modes (cuBLASLt 12.9+ on sm_90) or the fallback kernel, and MXFP4 experts
// through the W4A16 kernel.
func doctorQuantLinears(w io.Writer, gpus []cudart.DeviceInfo) {
	fmt.Fprintln(w, "\nGPU linears (checkpoint FP8 and MXFP4 weights kept packed)")
	if len(gpus) == 0 {
		fmt.Fprintln(w, "  no GPU found: the CPU path dequantises FP8 and FP4 weights to float32 at load")
		return
	}
	for _, g := range gpus {
		fp8 := "resin_fp8_block_gemm kernel"
		ok, why := cudart.BlockScaledFP8On(g)
		if ok {
			fp8 = "cuBLASLt VEC128×BLK128x128"
		}
		fmt.Fprintf(w, "  %d: %s: fp8-block128 via %s (%s); mxfp4 via resin_mxfp4_gemm (W4A16)\n", g.Ordinal, g.Arch(), fp8, why)
	}
}

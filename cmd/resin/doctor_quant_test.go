package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
)

// TestDoctorQuantLinears: doctor names the fallback kernel on a GPU without cuBLASLt's
// block-scaled FP8 modes (an A100 here, whatever cuBLASLt is installed) and says what the
// CPU does without a GPU.
func TestDoctorQuantLinears(t *testing.T) {
	var out bytes.Buffer
	doctorQuantLinears(&out, []cudart.DeviceInfo{{Ordinal: 0, Major: 8, Minor: 0}})
	if got := out.String(); !strings.Contains(got, "0: sm_80: fp8-block128 via resin_fp8_block_gemm kernel") || !strings.Contains(got, "mxfp4 via resin_mxfp4_gemm") {
		t.Errorf("an sm_80 GPU:\n%s", got)
	}
	out.Reset()
	doctorQuantLinears(&out, nil)
	if got := out.String(); !strings.Contains(got, "no GPU found") {
		t.Errorf("no GPU:\n%s", got)
	}
}

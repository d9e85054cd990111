// Package gputest holds what the real-GPU tests share: which GPUs a multi-rank test runs
// on, and the skips where the machine cannot run it. (core/cudart/emutest is the emulated
// device's; cudart's own tests import that, so this cannot live there.)
package gputest

import (
	"os"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
)

// TwoRankGPUs returns the GPUs a real-GPU test runs two NCCL ranks on: 0 and 1 where the
// driver shows two, else GPU 0 twice, which needs NCCL ≥ 2.30 with
// NCCL_MULTI_RANK_GPU_ENABLE=1 (set, it puts both ranks on GPU 0 however many there are).
// It skips t without a GPU or NCCL, where one GPU cannot hold two ranks, and on the
// emulated device (whose tests run the TestEmulated* forms).
func TwoRankGPUs(t testing.TB) []int {
	t.Helper()
	if cudart.Emulated() {
		t.Skip("the emulated device runs the TestEmulated* form of this test")
	}
	n, err := cudart.DeviceCount()
	if err != nil || n == 0 {
		t.Skipf("no GPU: %v", err)
	}
	v, err := cudart.NCCLVersion()
	if err != nil {
		t.Skipf("no NCCL: %v", err)
	}
	ordinals := []int{0, 1}
	if n == 1 || os.Getenv("NCCL_MULTI_RANK_GPU_ENABLE") == "1" {
		ordinals = []int{0, 0}
		if v < 23000 || os.Getenv("NCCL_MULTI_RANK_GPU_ENABLE") != "1" {
			t.Skipf("two ranks on one GPU need NCCL >= 2.30 (this is %d) with NCCL_MULTI_RANK_GPU_ENABLE=1", v)
		}
	}
	t.Logf("NCCL %d, ranks on GPUs %v", v, ordinals)
	return ordinals
}

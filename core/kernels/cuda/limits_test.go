package cuda

import (
	"regexp"
	"strconv"
	"testing"
)

// TestLimitsMatchSources checks that the launchers' limits are the #defines the kernels
// were written for: a launcher that allowed a larger head dim, or launched another block
// size, than paged_attention.cu assumes would leave output dimensions unwritten or
// overrun shared memory, with no error anywhere.
func TestLimitsMatchSources(t *testing.T) {
	define := func(file, name string) int {
		t.Helper()
		src, err := files.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^#define ` + name + ` (\d+)\b`).FindSubmatch(src)
		if m == nil {
			t.Fatalf("%s defines no %s", file, name)
		}
		n, _ := strconv.Atoi(string(m[1]))
		return n
	}
	for _, c := range []struct {
		file, name string
		got        int
	}{
		{"paged_attention.cu", "RESIN_ATTN_MAX_DIM", MaxHeadDim},
		{"paged_attention.cu", "RESIN_ATTN_THREADS", attnThread},
		{"moe_topk.cu", "RESIN_MOE_MAX_EXPERTS", MaxExperts},
		{"flash_attention.cu", "RESIN_FA_MAX_DIM", MaxAttnHeadDim},
		{"flash_attention.cu", "RESIN_FA_THREADS", faThreads},
		{"flash_attention.cu", "RESIN_FA_QROWS", faQueryRows},
		{"flash_attention.cu", "RESIN_FA_QROWS", MaxDecodeGroup},
		{"flash_attention.cu", "RESIN_FA_KEYS", faKeys},
		{"sampling.cu", "RESIN_SAMPLE_THREADS", sampleThreads},
		{"sampling.cu", "RESIN_SAMPLE_MAX_TOP", MaxSampleTop},
		{"prelude.cuh", "RESIN_PAGE_SLOT_BITS", PageSlotBits},
	} {
		if want := define(c.file, c.name); c.got != want {
			t.Errorf("%s: %s is %d, the launcher uses %d", c.file, c.name, want, c.got)
		}
	}
	// flash_attention.cu: 4 warps of RESIN_FA_ROWS rows make a block's query rows, and a
	// lane holds 8 output dimensions (4 bf16 pairs): 32 lanes × 8 cover the widest head.
	if faThreads/32*4 != faQueryRows || 32*8 < MaxAttnHeadDim {
		t.Errorf("%d threads, %d query rows and head dim %d do not fit the kernel's warp layout", faThreads, faQueryRows, MaxAttnHeadDim)
	}
	// Each thread of the attention block owns two output dimensions.
	if MaxHeadDim > 2*attnThread {
		t.Errorf("head dim %d needs more than the %d dimensions %d threads own", MaxHeadDim, 2*attnThread, attnThread)
	}
}

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
		m := regexp.MustCompile(`(?m)^#define ` + name + ` (\d+)$`).FindSubmatch(src)
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
	} {
		if want := define(c.file, c.name); c.got != want {
			t.Errorf("%s: %s is %d, the launcher uses %d", c.file, c.name, want, c.got)
		}
	}
	// Each thread of the attention block owns two output dimensions.
	if MaxHeadDim > 2*attnThread {
		t.Errorf("head dim %d needs more than the %d dimensions %d threads own", MaxHeadDim, 2*attnThread, attnThread)
	}
}

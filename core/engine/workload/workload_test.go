package workload

import "testing"

func TestSplitMix64FirstOutput(t *testing.T) {
	if got := NewSplitMix64(0).Next(); got != 0xe220a8397b1dcdaf {
		t.Fatalf("first output %#x, want 0xe220a8397b1dcdaf", got)
	}
}

func TestW1Checksums(t *testing.T) {
	reqs := W1()
	c := Sum(reqs)
	if c.Requests != 256 || c.PromptTokens != 131072 || c.TokenSum != 2127739130 || c.MaxTokensSum != 256*256 {
		t.Fatalf("W1 checksums %+v", c)
	}
	for i, r := range reqs {
		for j := 0; j < 256; j++ {
			if r.Prompt[j] != reqs[0].Prompt[j] {
				t.Fatalf("request %d does not share the prefix at %d", i, j)
			}
		}
	}
}

func TestW2Checksums(t *testing.T) {
	reqs := W2()
	c := Sum(reqs)
	if c.Requests != 1024 || c.PromptTokens != 1045277 || c.TokenSum != 16707943602 || c.MaxTokensSum != 273160 {
		t.Fatalf("W2 checksums %+v", c)
	}
	if len(reqs[0].Prompt) != 306 || reqs[0].MaxTokens != 297 {
		t.Fatalf("W2 request 0: %d prompt tokens, max_tokens %d", len(reqs[0].Prompt), reqs[0].MaxTokens)
	}
}

func TestByNameRejectsUnknown(t *testing.T) {
	if _, err := ByName("W3"); err == nil {
		t.Fatal("W3 accepted")
	}
}

package deepseekv4flash

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/kvslab"
)

// wideConfigJSON is the tiny config with 4 o_groups and 6 routed experts, so that TP=4
// fits (a head and an o_group each) and EP=4 holds experts 2, 2, 2 and 0 (uneven, an
// expert-less rank).
var wideConfigJSON = strings.NewReplacer(`"n_routed_experts": 4`, `"n_routed_experts": 6`,
	`"o_groups": 2`, `"o_groups": 4`).Replace(tinyConfigJSON)

// wideInProcess opens the wide config in layout l over goroutine ranks.
func wideInProcess(t *testing.T, l Layout) (*Group, *kvslab.Pool, error) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(wideConfigJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	g, pool, err := OpenInProcess(dir, tinyOpts, l, 8<<20, dist.Options{Timeout: 30 * time.Second})
	if err != nil {
		return nil, nil, err
	}
	t.Cleanup(func() {
		if err := g.StopRanks(); err != nil {
			t.Error(err)
		}
	})
	return g, pool, nil
}

// TestTPEPSizesEqualOneRank: TP and EP of different sizes over max(tp, ep) ranks, by
// either exchange, give one rank's logits within 1e-5 of each row's largest and its greedy
// tokens over a prompt and 64 steps; two runs of each are bit-identical. TP=2 × EP=4: two
// tp groups of two ranks run the same tokens, the experts split 2, 2, 2, 0 over all four;
// TP=4 × EP=2: the attention split four ways, two ep groups of two ranks each holding
// experts 3 and 3.
func TestTPEPSizesEqualOneRank(t *testing.T) {
	const steps = parSteps
	one, pool, err := wideInProcess(t, Layout{})
	if err != nil {
		t.Fatal(err)
	}
	want, wantToks := decode(t, one.Forward, pool, steps)
	v := tinyConfig(t).VocabSize // the wide config's too
	for _, l := range []Layout{{TP: 2, EP: 4}, {TP: 2, EP: 4, Dispatch: DispatchAllToAll}, {TP: 4, EP: 2}, {TP: 4, EP: 2, Dispatch: DispatchAllToAll}} {
		name := fmt.Sprintf("tp%d-ep%d-dispatch%d", l.TP, l.EP, l.Dispatch)
		t.Run(name, func(t *testing.T) {
			var runs [2][][]float32
			for i := range runs {
				g, pool, err := wideInProcess(t, l)
				if err != nil {
					t.Fatal(err)
				}
				var toks []int32
				runs[i], toks = decode(t, g.Forward, pool, steps)
				sameTokens(t, name, toks, wantToks)
			}
			closeLogits(t, name, runs[0], want, v, 1e-5)
			sameRunBits(t, name+" twice", runs[1], runs[0])
		})
	}
}

// TestTPEPSizesRefused: TP and EP of different sizes where neither divides the other are
// refused before any rank starts, naming the rule.
func TestTPEPSizesRefused(t *testing.T) {
	_, _, err := wideInProcess(t, Layout{TP: 2, EP: 3})
	if err == nil || !strings.Contains(err.Error(), "tp=2 with ep=3: the smaller must divide the larger") {
		t.Fatalf("tp=2 ep=3: %v", err)
	}
}

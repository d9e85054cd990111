package glm5flash

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// The parallel layouts on the tiny config (4 routed experts on 3 sparse layers): EP=3
// holds experts 2, 2 and 0 (uneven, an expert-less rank), and a decode step's two rows
// leave rank 2 without rows of its own under all-to-all.

// tinyDir writes the tiny config to a directory of its own (seeded random weights).
func tinyDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(tinyTextConfigJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

var tinyOpts = RankOptions{Seed: 7, MaxContext: 512, PageTokens: 8, CacheBytes: 8 << 20}

// oneRank returns the tiny model's plain runner's forward and pool (the reference).
func oneRank(t testing.TB) (cpurunner.ForwardFunc, *kvslab.Pool) {
	t.Helper()
	r, pool := tinyTextRunner(t)
	return r.forward, pool
}

// inProcess opens the tiny model in layout l over goroutine ranks.
func inProcess(t testing.TB, l Layout) (*Group, *kvslab.Pool) {
	t.Helper()
	g, pool, err := OpenInProcess(tinyDir(t), tinyOpts, l, dist.Options{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.StopRanks(); err != nil {
			t.Error(err)
		}
	})
	return g, pool
}

// decode feeds a 13-token prompt and then steps greedy steps through forward, with a
// second sequence of 6 prompt tokens in the same plans, returning every step's logits
// (both rows) and the first sequence's tokens.
func decode(t testing.TB, forward cpurunner.ForwardFunc, pool *kvslab.Pool, steps int) ([][]float32, []int32) {
	t.Helper()
	v := tinyTextModel(t).Config.VocabSize
	a := runnertest.OpenSeq(t, pool, runnertest.Prompt(13, v, 1))
	b := runnertest.OpenSeq(t, pool, runnertest.Prompt(6, v, 2))
	n := []int{len(a.Tokens), len(b.Tokens)}
	var all [][]float32
	var toks []int32
	for range steps + 1 {
		plan := runnertest.Plan(t, pool, []*runnertest.Seq{a, b}, n, false)
		logits := make([]float32, 2*v)
		if err := forward(plan, logits); err != nil {
			t.Fatal(err)
		}
		all = append(all, logits)
		ta, tb := int32(argmax(logits[:v])), int32(argmax(logits[v:]))
		a.Tokens, b.Tokens = append(a.Tokens, ta), append(b.Tokens, tb)
		toks = append(toks, ta)
		n = []int{1, 1}
	}
	return all, toks
}

// closeLogits fails unless every row of got is within tol of want relative to the row's
// largest magnitude.
func closeLogits(t *testing.T, what string, got, want [][]float32, v int, tol float64) {
	t.Helper()
	worst := 0.0
	for s := range want {
		for r := 0; r < len(want[s]); r += v {
			row, ref := got[s][r:r+v], want[s][r:r+v]
			scale := 0.0
			for _, x := range ref {
				scale = max(scale, math.Abs(float64(x)))
			}
			for i := range ref {
				d := math.Abs(float64(row[i]-ref[i])) / scale
				worst = max(worst, d)
				if d > tol || math.IsNaN(d) {
					t.Fatalf("%s: step %d row %d logit %d: %g, one rank %g", what, s, r/v, i, row[i], ref[i])
				}
			}
		}
	}
	t.Logf("%s: largest relative difference %.2g", what, worst)
}

func sameTokens(t *testing.T, what string, got, want []int32) {
	t.Helper()
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s: step %d: token %d, one rank %d", what, i, got[i], want[i])
		}
	}
}

func sameRunBits(t *testing.T, what string, got, want [][]float32) {
	t.Helper()
	for s := range want {
		for i := range want[s] {
			if math.Float32bits(got[s][i]) != math.Float32bits(want[s][i]) {
				t.Fatalf("%s: step %d logit %d: %g, then %g", what, s, i, got[s][i], want[s][i])
			}
		}
	}
}

const parSteps = 64

// TestEPEqualsOneRank: expert parallelism over 2 and 3 ranks (3: experts 2, 2, 0), with
// either exchange, gives one rank's logits within 1e-5 of each row's largest and its
// greedy tokens over a prompt and 64 steps (two sequences per plan); two runs of a layout
// are bit-identical.
func TestEPEqualsOneRank(t *testing.T) {
	fwd, pool := oneRank(t)
	want, wantToks := decode(t, fwd, pool, parSteps)
	v := tinyTextModel(t).Config.VocabSize
	for _, c := range []struct {
		name string
		l    Layout
	}{
		{"ep2-gather", Layout{EP: 2}},
		{"ep3-gather", Layout{EP: 3}},
		{"ep2-alltoall", Layout{EP: 2, Dispatch: DispatchAllToAll}},
		{"ep3-alltoall", Layout{EP: 3, Dispatch: DispatchAllToAll}},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, pool := inProcess(t, c.l)
			got, toks := decode(t, g.Forward, pool, parSteps)
			closeLogits(t, c.name, got, want, v, 1e-5)
			sameTokens(t, c.name, toks, wantToks)
			g2, pool2 := inProcess(t, c.l)
			again, _ := decode(t, g2.Forward, pool2, parSteps)
			sameRunBits(t, c.name+" twice", again, got)
		})
	}
}

// TestRankWeights: a rank's shard holds only its experts (an expert-less rank none), and
// the shard read from a saved checkpoint with per-expert tensors equals ShardTextWeights'.
func TestRankWeights(t *testing.T) {
	m := tinyTextModel(t)
	c := m.Config
	per := 2 * c.MoEIntermediateSize * c.HiddenSize
	for rank, want := range []int{2, 2, 0} {
		s, err := ShardTextWeights(c, m.W, Layout{EP: 3}, rank)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(s.layers[1].moe.gateUp) / per; got != want {
			t.Fatalf("ep=3 rank %d holds %d experts, want %d", rank, got, want)
		}
	}
	// A checkpoint with per-expert tensors (experts.E.{gate,up,down}_proj.weight): the
	// model's experts, random values for the rest.
	src := mapSource{}
	names := map[string][]float32{}
	for i, ly := range m.W.layers {
		if ly.moe == nil {
			continue
		}
		F, D := c.MoEIntermediateSize, c.HiddenSize
		for e := range c.NRoutedExperts {
			p := fmt.Sprintf("%slayers.%d.mlp.experts.%d.", TextPrefix, i, e)
			gu := ly.moe.gateUp[e*2*F*D : (e+1)*2*F*D]
			names[p+"gate_proj.weight"] = gu[:F*D]
			names[p+"up_proj.weight"] = gu[F*D:]
			names[p+"down_proj.weight"] = ly.moe.down[e*D*F : (e+1)*D*F]
		}
	}
	src.fallback = randomSource{rand.New(rand.NewPCG(7, 7))}
	src.m, src.layers = names, c.NumHiddenLayers
	for rank := range 3 {
		got, err := loadTextShard(src, c, &[2]int{[]int{0, 2, 4}[rank], []int{2, 4, 4}[rank]}, nil)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := ShardTextWeights(c, m.W, Layout{EP: 3}, rank)
		for i := range want.layers {
			if want.layers[i].moe == nil {
				continue
			}
			if !slices.Equal(got.layers[i].moe.gateUp, want.layers[i].moe.gateUp) || !slices.Equal(got.layers[i].moe.down, want.layers[i].moe.down) {
				t.Fatalf("rank %d layer %d: the loaded experts differ from ShardTextWeights'", rank, i)
			}
		}
	}
	if err := (Layout{TP: 3}).Check(c); err == nil {
		t.Fatal("tp=3 over 2 heads was accepted")
	}
}

// mapSource holds the tensors of m, and random ones (fallback) for any other name but a
// fused experts tensor and the MTP layer's.
type mapSource struct {
	m        map[string][]float32
	fallback randomSource
	layers   int // no MTP layer (layers.{layers}.*)
}

func (s mapSource) Names() []string { return nil }
func (s mapSource) Has(name string) bool {
	_, ok := s.m[name]
	return ok || !strings.Contains(name, ".experts.") && !mtpTensor(name, s.layers)
}
func (s mapSource) Float32(name string, shape ...int) ([]float32, error) {
	if v, ok := s.m[name]; ok {
		return v, nil
	}
	return s.fallback.Float32(name, shape...)
}

// TestParallelConformance runs core/runnertest's suite on rank 0's runner of TP=2, EP=3
// (an expert-less rank) and EP=2 by all-to-all through the real engine.
func TestParallelConformance(t *testing.T) {
	for _, l := range []Layout{{TP: 2}, {EP: 3}, {EP: 2, Dispatch: DispatchAllToAll}} {
		t.Run(fmt.Sprintf("tp%d-ep%d-dispatch%d", l.TP, l.EP, l.Dispatch), func(t *testing.T) {
			runnertest.Run(t, func(t testing.TB) (engine.Runner, *kvslab.Pool) {
				return inProcess(t, l)
			}, runnertest.Options{})
		})
	}
}

// TestTPEqualsOneRank: tensor parallelism over 2 ranks (one MLA and one KDA head, half of
// every MLP's and expert's intermediate columns and of the vocabulary each), and TP=2
// with the routed experts split over the same ranks (EP=2, each expert whole) by either
// exchange, give one rank's logits within 1e-5 of each row's largest and its greedy
// tokens over a prompt and 64 steps; two runs of each are bit-identical.
func TestTPEqualsOneRank(t *testing.T) {
	fwd, pool := oneRank(t)
	want, wantToks := decode(t, fwd, pool, parSteps)
	for _, l := range []Layout{{TP: 2}, {TP: 2, EP: 2}, {TP: 2, EP: 2, Dispatch: DispatchAllToAll}} {
		name := fmt.Sprintf("tp%d-ep%d-dispatch%d", l.TP, l.EP, l.Dispatch)
		t.Run(name, func(t *testing.T) {
			g, gpool := inProcess(t, l)
			got, toks := decode(t, g.Forward, gpool, parSteps)
			closeLogits(t, name, got, want, tinyTextModel(t).Config.VocabSize, 1e-5)
			sameTokens(t, name, toks, wantToks)
			g2, gpool2 := inProcess(t, l)
			again, _ := decode(t, g2.Forward, gpool2, parSteps)
			sameRunBits(t, name+" twice", again, got)
		})
	}
}

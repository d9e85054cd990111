package deepseekv4flash

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/core/weights"
)

// The parallel layouts on the tiny config (4 heads, 2 o_groups, 4 routed experts,
// moe_intermediate_size 16): EP=3 holds experts 2, 2 and 0 (uneven, an expert-less rank),
// and a decode step's one row leaves ranks 1 and 2 without rows of their own.

// tinyDir writes the tiny config to a directory of its own (seeded random weights).
func tinyDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(tinyConfigJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

var tinyOpts = Options{Seed: 7, MaxContext: 512, PageTokens: 8}

// oneRank returns the tiny model's plain runner's forward and pool (the reference).
func oneRank(t testing.TB) (cpurunner.ForwardFunc, *kvslab.Pool) {
	t.Helper()
	c := tinyConfig(t)
	m, err := NewModel(c, RandomWeights(c, 7, false), 512)
	if err != nil {
		t.Fatal(err)
	}
	r := NewRunner(m, 8)
	pool, err := r.NewPool(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	return r.forward, pool
}

// inProcess opens the tiny model in layout l over goroutine ranks.
func inProcess(t testing.TB, l Layout) (*Group, *kvslab.Pool) {
	t.Helper()
	g, pool, err := OpenInProcess(tinyDir(t), tinyOpts, l, 8<<20, dist.Options{Timeout: 30 * time.Second})
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
	v := tinyConfig(t).VocabSize
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
		ta, tb := argmaxID(logits[:v]), argmaxID(logits[v:])
		a.Tokens, b.Tokens = append(a.Tokens, ta), append(b.Tokens, tb)
		toks = append(toks, ta)
		n = []int{1, 1}
	}
	return all, toks
}

func argmaxID(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
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
	v := tinyConfig(t).VocabSize
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

// TestRankWeights: a rank's shard holds only its experts (an expert-less rank none),
// LoadShard from a saved checkpoint (per-expert and packed names) gives ShardWeights'
// slices, and a layout the config does not divide, or TP and EP of sizes neither of
// which divides the other, is refused.
func TestRankWeights(t *testing.T) {
	c := tinyConfig(t)
	w := RandomWeights(c, 7, false)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(tinyConfigJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, form := range []NameForm{UpstreamNames, ModuleNames} {
		sub := filepath.Join(dir, form.String())
		if err := w.Save(c, sub, weights.F32, form); err != nil {
			t.Fatal(err)
		}
		ck, err := weights.Open(sub)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range []Layout{{EP: 3}, {TP: 2}, {TP: 2, EP: 2}, {TP: 2, EP: 4}} {
			for rank := range l.Size() {
				got, err := LoadShard(c, ck, l, rank)
				if err != nil {
					t.Fatalf("%s form, %+v rank %d: %v", form, l, rank, err)
				}
				want, _ := ShardWeights(c, w, l, rank)
				for i := range want.Layers {
					a, b := &got.Layers[i], &want.Layers[i]
					for j, pair := range [][2][]float32{{a.GateUp, b.GateUp}, {a.Down, b.Down}, {a.QB, b.QB}, {a.OA, b.OA}, {a.OB, b.OB}, {a.SharedDown, b.SharedDown}} {
						if !slices.Equal(pair[0], pair[1]) {
							t.Fatalf("%s form, %+v rank %d layer %d: tensor %d differs from ShardWeights'", form, l, rank, i, j)
						}
					}
				}
				if !slices.Equal(got.Embed, want.Embed) {
					t.Fatalf("%s form, %+v rank %d: embedding differs", form, l, rank)
				}
			}
		}
		ck.Close()
	}
	per := 2 * c.MoEIntermediateSize * c.HiddenSize
	for rank, want := range []int{2, 2, 0} {
		s, err := ShardWeights(c, w, Layout{EP: 3}, rank)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(s.Layers[1].GateUp) / per; got != want {
			t.Fatalf("ep=3 rank %d holds %d experts, want %d", rank, got, want)
		}
	}
	if _, err := ShardWeights(c, w, Layout{TP: 3}, 0); err == nil {
		t.Fatal("tp=3 over 4 heads was accepted")
	}
	if _, err := ShardWeights(c, w, Layout{TP: 2, EP: 3}, 0); err == nil {
		t.Fatal("tp=2 with ep=3 was accepted")
	}
}

// TestTPEqualsOneRank: tensor parallelism over 2 ranks (2 heads, 1 o_group, 8 of the 16
// intermediate columns of every expert and half the vocabulary each), and TP=2 with the
// routed experts split over the same ranks (EP=2, each expert whole) by either exchange,
// give one rank's logits within 1e-5 of each row's largest and its greedy tokens over a
// prompt and 64 steps; two runs of each are bit-identical.
func TestTPEqualsOneRank(t *testing.T) {
	fwd, pool := oneRank(t)
	want, wantToks := decode(t, fwd, pool, parSteps)
	for _, l := range []Layout{{TP: 2}, {TP: 2, EP: 2}, {TP: 2, EP: 2, Dispatch: DispatchAllToAll}} {
		name := fmt.Sprintf("tp%d-ep%d-dispatch%d", l.TP, l.EP, l.Dispatch)
		t.Run(name, func(t *testing.T) {
			g, gpool := inProcess(t, l)
			got, toks := decode(t, g.Forward, gpool, parSteps)
			closeLogits(t, name, got, want, tinyConfig(t).VocabSize, 1e-5)
			sameTokens(t, name, toks, wantToks)
			g2, gpool2 := inProcess(t, l)
			again, _ := decode(t, g2.Forward, gpool2, parSteps)
			sameRunBits(t, name+" twice", again, got)
		})
	}
}

// TestParallelConformance runs core/runnertest's suite on rank 0's runner of TP=2 and of
// EP=3 (an expert-less rank) through the real engine.
func TestParallelConformance(t *testing.T) {
	for _, l := range []Layout{{TP: 2}, {EP: 3}} {
		t.Run(fmt.Sprintf("tp%d-ep%d", l.TP, l.EP), func(t *testing.T) {
			runnertest.Run(t, func(t testing.TB) (engine.Runner, *kvslab.Pool) {
				return inProcess(t, l)
			}, runnertest.Options{})
		})
	}
}

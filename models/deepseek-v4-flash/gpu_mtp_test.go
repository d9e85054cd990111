package deepseekv4flash

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/runnertest"
)

// draftLog is gpuDrafter recording the drafts it proposes, by the sequence (its prompt
// length), the length it drafts after and the draft's index: the same for any schedule
// of the same requests.
type draftLog struct {
	gpuDrafter
	drafts map[draftKey]int32
	steps  int // steps with drafts
	most   int // the most sequences one step drafted for
}

type draftKey struct{ promptLen, end, j int }

func (d *draftLog) Draft(p *engine.BatchPlan, res *engine.StepResult) error {
	at := len(res.Drafts)
	if err := d.gpuDrafter.Draft(p, res); err != nil {
		return err
	}
	seqs := 0
	for i := range p.ReqIDs {
		k := int(res.NumNextDrafts[i])
		if k == 0 {
			continue
		}
		// The sequence's length once the step's rejected drafts are dropped (the sampled
		// token not yet fed), as GPURunner.draft computes it.
		end := int(p.Computed[i]+p.Scheduled[i]-p.NumDrafts[i]+res.Accepted[i]) - 1
		for j, t := range res.Drafts[at : at+k] {
			key := draftKey{int(p.PromptLen[i]), end, j}
			if _, dup := d.drafts[key]; dup {
				return fmt.Errorf("draft %d after %d tokens of the prompt of %d proposed twice", j, end, key.promptLen)
			}
			d.drafts[key] = t
		}
		at += k
		seqs++
	}
	if seqs > 0 {
		d.steps++
		d.most = max(d.most, seqs)
	}
	return nil
}

// TestEmulatedMTPDeviceDrafts checks the MTP drafting chain on the (emulated) device
// (resin_argmax on the head's logits, each draft fed to the next step on the device, the
// drafts copied back once) against the host path (the head's logits copied back at every
// step, their argmax taken there and uploaded): through the real engine, six prompts of
// different lengths decoding together (several drafting rows a step, at different
// positions), one-shot prefill with 3 drafts and chunked with 2: every draft equal, keyed by
// sequence, length and index (the engine's schedule may differ between runs); the same
// with the chain replayed as CUDA graphs (graph equals eager); and the greedy tokens of
// all three those of the runner without MTP.
func TestEmulatedMTPDeviceDrafts(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	dev, cache := openTestGPU(t)
	m := tinyModel(t)
	prompts := specPrompts(m.Config.VocabSize)
	greedy := engine.SamplingParams{MaxTokens: 9, IgnoreEOS: true}
	want := map[int][]runnertest.Output{} // per budget, greedy without MTP
	for _, tc := range []struct{ budget, drafts int }{{64, 3}, {13, 2}} {
		budget, drafts := tc.budget, tc.drafts
		if want[budget] == nil {
			plain, err := NewGPURunner(m, dev, cache, cudart.F32, 8, 64, 8)
			if err != nil {
				t.Fatal(err)
			}
			want[budget] = serveGPU(t, plain, prompts, greedy, budget)
			plain.Close()
		}
		what := fmt.Sprintf("budget %d, %d drafts", budget, drafts)
		// The device chain eager, the host path, the device chain as CUDA graphs.
		var logs [3]*draftLog
		var outs [3][]runnertest.Output
		chainGraphs := 0
		for k := range logs {
			r, err := NewGPUMTPRunner(m, dev, cache, cudart.F32, 8, 64, 8*(1+drafts), drafts)
			if err != nil {
				t.Fatal(err)
			}
			switch k {
			case 1: // the host path: the argmax of the logits copied back
				r.forceDraft = func(_, _ int, logits []float32) int32 { return int32(max(0, argmax(logits))) }
			case 2:
				if err := r.UseGraphs(true, nil); err != nil {
					t.Fatal(err)
				}
			}
			logs[k] = &draftLog{gpuDrafter: gpuDrafter{r}, drafts: map[draftKey]int32{}}
			r.Runner, r.drafter = cpurunner.New(r.Info(), logs[k]), logs[k]
			outs[k] = serveGPU(t, r, prompts, greedy, budget)
			if k == 2 {
				chainGraphs = r.g.Stats.DraftGraph
			}
			r.Close()
		}
		if chainGraphs == 0 {
			t.Fatalf("%s: no drafting chain replayed a graph", what)
		}
		if !maps.Equal(logs[2].drafts, logs[0].drafts) {
			t.Fatalf("%s: the drafts with the chain's graphs differ from the eager chain's", what)
		}
		dl, hl := logs[0], logs[1]
		if dl.steps < 2 || dl.most < 2 {
			t.Fatalf("%s: %d drafting steps, at most %d sequences in one: want several of each", what, dl.steps, dl.most)
		}
		distinct := map[int32]bool{}
		for key, d := range dl.drafts {
			h, ok := hl.drafts[key]
			if !ok {
				t.Fatalf("%s: the device drafted %d after %d tokens of the prompt of %d, the host path did not", what, key.j, key.end, key.promptLen)
			}
			if d != h {
				t.Fatalf("%s: draft %d after %d tokens of the prompt of %d: %d on the device, the host argmax %d", what, key.j, key.end, key.promptLen, d, h)
			}
			distinct[d] = true
		}
		if len(hl.drafts) != len(dl.drafts) {
			t.Fatalf("%s: %d drafts on the device, %d on the host path", what, len(dl.drafts), len(hl.drafts))
		}
		if len(distinct) < 2 {
			t.Fatalf("%s: every draft is one of %v: the comparison shows nothing", what, distinct)
		}
		for i := range prompts {
			for k := range outs {
				if w := want[budget][i].Tokens; !slices.Equal(outs[k][i].Tokens, w) {
					t.Fatalf("%s: prompt of %d tokens: %v with MTP (runner %d), %v without", what, len(prompts[i]), outs[k][i].Tokens, k, w)
				}
			}
		}
		t.Logf("%s: %d drafts in %d steps (the host path's %d), up to %d sequences a step, %d distinct; %d chains replayed as graphs", what, len(dl.drafts), dl.steps, hl.steps, dl.most, len(distinct), chainGraphs)
	}
}

// serveGPU generates the prompts together through a fresh engine on r with a pool of its
// own and budget tokens a step.
func serveGPU(t *testing.T, r *GPURunner, prompts [][]int32, sp engine.SamplingParams, budget int) []runnertest.Output {
	t.Helper()
	pool, err := r.NewPool(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	var s runnertest.Suite
	h := s.StartWith(t, r, pool, engine.Config{MaxBatchTokens: budget, MaxSeqs: 8})
	defer h.Stop(t)
	return h.GenerateAll(t, prompts, sp)
}

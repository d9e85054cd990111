package gpurunner_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"testing"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/grammar"
	"github.com/resin-llm/resin/core/runnertest"
)

// constrainedRegex is a small JSON object whose every output fits the tiny llama's context.
const constrainedRegex = `\{"n": (0|[1-9][0-9]?), "unit": "(celsius|fahrenheit)", "ok": (true|false)\}`

// tinyVocab is tinyLlama's vocabulary as bytes for the grammar: ids 3..255 the bytes, a
// few pieces spanning several terminals past them; BOS (1) has none, EOS is 2.
func tinyVocab(t *testing.T) ([][]byte, *grammar.Vocabulary) {
	toks := make([][]byte, 261)
	for b := 3; b < 256; b++ {
		toks[b] = []byte{byte(b)}
	}
	for k, p := range []string{`{"`, `": `, `", "`, `"}`, `celsius`} {
		toks[256+k] = []byte(p)
	}
	special := make([]bool, 261)
	special[0], special[1] = true, true
	v, err := grammar.NewVocabulary(toks, []int32{2}, special)
	if err != nil {
		t.Fatal(err)
	}
	return toks, v
}

// TestEmulatedConstrainedGeneration runs grammar-constrained requests (greedy and seeded,
// batched with an unconstrained one) on the GPU runner on the emulated device: with the
// device sampling kernel applying the masks, with graphs and eagerly, and with every
// logits row brought back to engine.Sampler on the host (CaptureLogits). Every
// constrained output matches the grammar, parses as JSON and ends with EOS; the device's
// tokens equal the host sampler's on the same logits, and graphs equal eager bit for bit
// (the graph reads each step's masks from its fixed buffer).
func TestEmulatedConstrainedGeneration(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	dir := tinyLlama(t)
	toks, v := tinyVocab(t)
	g, err := grammar.Compile(v, grammar.Regex, constrainedRegex)
	if err != nil {
		t.Fatal(err)
	}
	prompts := [][]int32{runnertest.Prompt(4, 261, 21), runnertest.Prompt(17, 261, 22), runnertest.Prompt(9, 261, 23)}
	base := engine.SamplingParams{MaxTokens: 80, Logprobs: true, TopLogprobs: 3}
	params := []engine.SamplingParams{base, base, base}
	params[1].Temperature, params[1].Seed, params[1].HasSeed = 0.9, 31, true
	params[2].Temperature, params[2].TopK, params[2].TopP, params[2].Seed, params[2].HasSeed = 1.3, 20, 0.9, 32, true
	free := engine.SamplingParams{MaxTokens: 12, IgnoreEOS: true, Logprobs: true, TopLogprobs: 3}

	type run struct {
		name   string
		eager  bool
		host   bool
		outs   []runnertest.Output
		stats  string
		device int
	}
	runs := []*run{{name: "device, graphs"}, {name: "device, eager", eager: true}, {name: "host sampler", host: true}}
	for _, rn := range runs {
		r, pool := openEmulatedGPU(t, dir, 4<<20, rn.eager)
		gr := r.(*gpurunner.Runner)
		if rn.host {
			gr.CaptureLogits(func(cpurunner.LogitsRow) {})
		}
		h := (&runnertest.Suite{}).StartWith(t, r, pool, engine.Config{})
		ctx := context.Background()
		for _, sp := range params {
			// Each constrained request gets its own matcher; the unconstrained one shares
			// the batches.
			var streams []*engine.Stream
			for i, p := range prompts {
				m, err := g.NewMatcher()
				if err != nil {
					t.Fatal(err)
				}
				c := sp
				c.Constraint = m
				st, err := h.Submit(ctx, engine.Request{ID: fmt.Sprintf("c%d", i), Prompt: p, Sampling: c})
				if err != nil {
					t.Fatal(err)
				}
				streams = append(streams, st)
			}
			st, err := h.Submit(ctx, engine.Request{Prompt: prompts[0], Sampling: free})
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, st)
			for _, st := range streams {
				rn.outs = append(rn.outs, collectOutput(t, ctx, st))
			}
		}
		h.Stop(t)
		rn.stats, rn.device = fmt.Sprintf("%+v", gr.Stats), gr.Stats.DeviceSampled
	}
	if runs[0].device == 0 || runs[1].device == 0 || runs[2].device != 0 {
		t.Fatalf("device-sampled steps: %s; %s; %s", runs[0].stats, runs[1].stats, runs[2].stats)
	}
	re := regexp.MustCompile(`^` + constrainedRegex + `$`)
	for _, rn := range runs {
		for k, o := range rn.outs {
			if k%(len(prompts)+1) == len(prompts) {
				continue // the unconstrained request
			}
			if o.Finish != engine.FinishStop || len(o.Tokens) == 0 || o.Tokens[len(o.Tokens)-1] != 2 {
				t.Fatalf("%s, request %d: finish %s, tokens %v: not ended by EOS", rn.name, k, o.Finish, o.Tokens)
			}
			var text []byte
			for _, tok := range o.Tokens[:len(o.Tokens)-1] {
				text = append(text, toks[tok]...)
			}
			var obj struct {
				N    *int   `json:"n"`
				Unit string `json:"unit"`
				OK   *bool  `json:"ok"`
			}
			if !re.Match(text) || json.Unmarshal(text, &obj) != nil || obj.N == nil || obj.OK == nil {
				t.Fatalf("%s, request %d: %q does not validate", rn.name, k, text)
			}
			if k < 3 || k == 4 {
				t.Logf("%s, request %d: %s", rn.name, k, text)
			}
		}
	}
	s := &runnertest.Suite{Opts: runnertest.Options{Tolerance: 1e-4}}
	for k := range runs[0].outs {
		if fmt.Sprint(runs[0].outs[k]) != fmt.Sprint(runs[1].outs[k]) {
			t.Errorf("request %d: with graphs %v, eager %v", k, runs[0].outs[k], runs[1].outs[k])
		}
		s.Same(t, fmt.Sprintf("request %d, device vs host sampler", k), runs[0].outs[k], runs[2].outs[k])
	}
	t.Logf("%s; %s; %s", runs[0].stats, runs[1].stats, runs[2].stats)
}

// collectOutput reads st to its end.
func collectOutput(t *testing.T, ctx context.Context, st *engine.Stream) runnertest.Output {
	t.Helper()
	var o runnertest.Output
	for {
		ev, err := st.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		o.Tokens = append(o.Tokens, ev.Tokens...)
		o.Logprobs = append(o.Logprobs, ev.Logprobs...)
		if ev.Finish != engine.FinishNone {
			if ev.Err != nil {
				t.Fatal(ev.Err)
			}
			o.Finish = ev.Finish
			return o
		}
	}
}

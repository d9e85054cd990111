package deepseekv4flash

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/runnertest"
)

// TestEmulatedMTPDeviceVerify checks sampling and MTP verification on the (emulated)
// device (gpu_sample.go) against the host path (cpurunner on the logits copied back),
// through the real engine: four prompts of different lengths decoding together with 2
// drafts, two greedy with logprobs and alternatives, two seeded at T = 0.8; chunked
// prefill beside decode rows; drafts forced right except at every third position, so that
// drafts are accepted, rejected first or later, and rolled back on the device after
// either path; two more requests beside them under a grammar's token masks (parity, drafts
// the masks allow: each verifying row is sampled under the mask after its drafts); then the
// four again from the prefix cache, then two with a logit bias (sampled on the host by both
// runners). The device-verified tokens equal the host path's and plain decoding's (itself
// sampled on the device), logprobs within 1e-4; the device runner copied no logits back
// but for the biased steps, the host runner did.
func TestEmulatedMTPDeviceVerify(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	dev, cache := openTestGPU(t)
	m := tinyModel(t)
	vocab := m.Config.VocabSize
	prompts := specPrompts(vocab)[:4]
	cprompts := [][]int32{runnertest.Prompt(9, vocab, 50), runnertest.Prompt(17, vocab, 51)} // under a grammar
	greedy := engine.SamplingParams{MaxTokens: 6, IgnoreEOS: true, Logprobs: true, TopLogprobs: 2}
	seeded := engine.SamplingParams{MaxTokens: 6, IgnoreEOS: true, Temperature: 0.8, Seed: 7, HasSeed: true, Logprobs: true}
	sps := []engine.SamplingParams{greedy, seeded, seeded, greedy}
	const budget, drafts = 16, 2
	type run struct {
		cold, hit, biased []runnertest.Output
		c                 engine.Counters
		hits              uint64
		device, host      int                 // steps sampled on the device and on the host
		copies            int                 // steps whose logits came back (forward)
		biasedHost        int                 // host steps of the biased requests
		constrained       []runnertest.Output // the cold pass's requests under a grammar
	}
	serve := func(r *GPURunner) run {
		pool, err := r.NewPool(8 << 20)
		if err != nil {
			t.Fatal(err)
		}
		var s runnertest.Suite
		h := s.StartWith(t, r, pool, engine.Config{MaxBatchTokens: budget, MaxSeqs: 8})
		defer h.Stop(t)
		var out run
		// The cold pass with two more requests under a grammar (fresh constraints).
		all, allSP := append(slices.Clone(prompts), cprompts...), slices.Clone(sps)
		for _, sp := range sps[:len(cprompts)] {
			sp.IgnoreEOS, sp.Constraint = false, &parity{words: cuda.MaskWords(vocab), eos: m.Config.EOSTokenID}
			allSP = append(allSP, sp)
		}
		cold := generateEach(t, h, all, allSP)
		out.cold, out.constrained = cold[:len(prompts)], cold[len(prompts):]
		out.c = h.Counters()
		out.hit = generateEach(t, h, prompts, sps)
		out.hits = h.Counters().PrefixHits - out.c.PrefixHits
		out.device, out.host, out.copies = r.Stats.DeviceSampled, r.Stats.HostSampled, r.g.Stats.LogitsCopies
		var biased []engine.SamplingParams
		for _, sp := range sps[:2] {
			sp.LogitBias = map[int32]float32{3: 2, 40: -1.5}
			biased = append(biased, sp)
		}
		out.biased = generateEach(t, h, prompts[:2], biased)
		out.biasedHost = r.Stats.HostSampled - out.host
		return out
	}
	same := func(what string, got, want []runnertest.Output) {
		t.Helper()
		for i := range want {
			if !slices.Equal(got[i].Tokens, want[i].Tokens) {
				t.Fatalf("%s: request %d: %v, the host path %v", what, i, got[i].Tokens, want[i].Tokens)
			}
			if len(got[i].Logprobs) != len(want[i].Logprobs) {
				t.Fatalf("%s: prompt %d: %d logprobs, the host path %d", what, i, len(got[i].Logprobs), len(want[i].Logprobs))
			}
			for j, w := range want[i].Logprobs {
				g := got[i].Logprobs[j]
				if d := math.Abs(float64(g.Logprob - w.Logprob)); !(d <= 1e-4) || len(g.Top) != len(w.Top) {
					t.Fatalf("%s: prompt %d token %d: logprob %g with %d alternatives, the host path %g with %d", what, i, j, g.Logprob, len(g.Top), w.Logprob, len(w.Top))
				}
				for a := range w.Top {
					if g.Top[a].Token != w.Top[a].Token || !(math.Abs(float64(g.Top[a].Logprob-w.Top[a].Logprob)) <= 1e-4) {
						t.Fatalf("%s: prompt %d token %d: alternative %d is %+v, the host path's %+v", what, i, j, a, g.Top[a], w.Top[a])
					}
				}
			}
		}
	}
	plain, err := NewGPURunner(m, dev, cache, cudart.F32, 8, 64, 8)
	if err != nil {
		t.Fatal(err)
	}
	want := serve(plain)
	plain.Close()
	full := map[int][]int32{}
	for i, p := range prompts {
		full[len(p)] = append(slices.Clone(p), want.cold[i].Tokens...)
	}
	for i, p := range cprompts { // drafts the masks allow: the rows after them get masks of their own
		full[len(p)] = append(slices.Clone(p), want.constrained[i].Tokens...)
	}
	var runs [2]run // the device path, the host path
	for k := range runs {
		r, err := NewGPUMTPRunner(m, dev, cache, cudart.F32, 8, 64, 8*(1+drafts), drafts)
		if err != nil {
			t.Fatal(err)
		}
		r.forceDraft = forcedDraft(full, 3, vocab)
		r.hostSampling = k == 1
		runs[k] = serve(r)
		r.Close()
	}
	dr, hr := runs[0], runs[1]
	same("device-verified", dr.cold, hr.cold)
	same("device-verified from the prefix cache", dr.hit, hr.hit)
	same("with a logit bias", dr.biased, hr.biased)
	same("host-verified, against plain decoding", hr.cold, want.cold)
	same("under a token mask", dr.constrained, hr.constrained)
	same("host-verified under a token mask, against plain decoding", hr.constrained, want.constrained)
	for i, o := range dr.constrained {
		for j, tok := range o.Tokens {
			if int(tok)%2 != j%2 {
				t.Fatalf("constrained request %d: token %d is %d, the mask allows only tokens of parity %d", i, j, tok, j%2)
			}
		}
	}
	if c := dr.c; c.DraftsAccepted == 0 || c.DraftsAccepted == c.DraftsProposed || dr.hits == 0 {
		t.Errorf("%d drafts, %d accepted, %d prefix hits: want some of each, and rejections", c.DraftsProposed, c.DraftsAccepted, dr.hits)
	}
	if dr.c.DraftsProposed != hr.c.DraftsProposed || dr.c.DraftsAccepted != hr.c.DraftsAccepted {
		t.Errorf("%d drafts, %d accepted on the device path; %d, %d on the host path", dr.c.DraftsProposed, dr.c.DraftsAccepted, hr.c.DraftsProposed, hr.c.DraftsAccepted)
	}
	if dr.device == 0 || dr.host != 0 || dr.copies != 0 {
		t.Errorf("the device path sampled %d steps on the device, %d on the host, and copied the logits of %d", dr.device, dr.host, dr.copies)
	}
	if hr.device != 0 || hr.copies == 0 || hr.host == 0 {
		t.Errorf("the host path sampled %d steps on the device, %d on the host, and copied the logits of %d", hr.device, hr.host, hr.copies)
	}
	if dr.biasedHost == 0 || want.device == 0 || want.copies != 0 {
		t.Errorf("%d steps of biased requests on the host; plain decoding sampled %d steps on the device, copied %d steps' logits", dr.biasedHost, want.device, want.copies)
	}
	t.Logf("%d drafts, %d accepted, %d prefix hits; device path %d steps on the device, %d logits copies; host path %d steps, %d copies",
		dr.c.DraftsProposed, dr.c.DraftsAccepted, dr.hits, dr.device, dr.copies, hr.host, hr.copies)
}

// parity is a grammar that allows only even tokens at even output positions and odd ones
// at odd positions, never an EOS id.
type parity struct {
	words, n int
	eos      []int32
}

func (c *parity) Words() int { return c.words }
func (c *parity) FillMask(mask []uint32) error {
	clear(mask)
	for t := c.n % 2; t < 32*c.words; t += 2 {
		if !slices.Contains(c.eos, int32(t)) {
			mask[t/32] |= 1 << (t % 32)
		}
	}
	return nil
}
func (c *parity) Accept(tok int32) error {
	if int(tok)%2 != c.n%2 {
		return fmt.Errorf("parity: token %d at output position %d", tok, c.n)
	}
	c.n++
	return nil
}
func (c *parity) Rollback(n int) error { c.n -= n; return nil }
func (c *parity) Ended() bool          { return false }

// generateEach submits prompt i with sps[i], all at once so that they share batches, and
// collects them.
func generateEach(t *testing.T, h *runnertest.Engine, prompts [][]int32, sps []engine.SamplingParams) []runnertest.Output {
	t.Helper()
	ctx := context.Background()
	streams := make([]*engine.Stream, len(prompts))
	for i, p := range prompts {
		st, err := h.Submit(ctx, engine.Request{Prompt: p, Sampling: sps[i]})
		if err != nil {
			t.Fatalf("submit prompt %d: %v", i, err)
		}
		streams[i] = st
	}
	outs := make([]runnertest.Output, len(prompts))
	for i, st := range streams {
		for {
			ev, err := st.Recv(ctx)
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			outs[i].Tokens = append(outs[i].Tokens, ev.Tokens...)
			outs[i].Logprobs = append(outs[i].Logprobs, ev.Logprobs...)
			if ev.Finish != engine.FinishNone {
				if ev.Err != nil {
					t.Fatalf("request %d: %v", i, ev.Err)
				}
				break
			}
		}
	}
	return outs
}

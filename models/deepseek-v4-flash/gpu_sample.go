package deepseekv4flash

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/cuda"
)

// Sampling on the device. A step whose every logits row the device kernels cover
// (deviceSamples) is sampled where its logits are: core/kernels/cuda's Sample over every
// row (a verifying sequence's rows too), then VerifyDrafts, which counts each sequence's
// accepted drafts as core/cpurunner verifies a Drafter's; only the counts, the tokens and
// what logprobs the plan asks for come back to the host, in one copy. The StepResult is
// the one cpurunner builds from the logits on the host (same tokens: the kernels follow
// engine.Sampler; logprobs within float rounding), and the MTP drafting that follows reads
// it as it does cpurunner's (its rollback of rejected drafts the device's accepted counts).
// Any other step (a logit bias, penalties, a min-tokens gate, prompt logprobs, more top
// logprobs than the kernel gives, capturing logits) goes through cpurunner on the host.

// gpuSampling is the device memory of sampling a step on the device: the inputs, uploaded
// in one copy, and the outputs, copied back in one.
//
//	in:  params [maxRows]SampleParams | drafts [maxRows] | logits starts [slots+1] |
//	     mask starts [maxRows] | token masks [maxRows, words]
//	out: accepted [slots] | tokens [maxRows] | logprobs [maxRows] |
//	     top ids [maxRows, MaxSampleTop] | top logprobs [maxRows, MaxSampleTop]
type gpuSampling struct {
	in, out                  cudart.DevicePtr
	drafts, starts, maskAt   int // byte offsets into in
	mask, inBytes            int
	tokens, lps, topIDs, top int // byte offsets into out
	outBytes                 int
	words                    int // uint32 words of a row's token mask
	// The host's copies, reused every step.
	hin, hout []byte
	params    []cuda.SampleParams
}

func newGPUSampling(a *gpuArena, c *cudart.Ctx, slots, maxRows, vocab int) (*gpuSampling, error) {
	s := &gpuSampling{words: cuda.MaskWords(vocab)}
	s.drafts = maxRows * cuda.SampleParamsBytes
	s.starts = s.drafts + 4*maxRows
	s.maskAt = s.starts + 4*(slots+1)
	s.mask = s.maskAt + 4*maxRows
	s.inBytes = s.mask + 4*maxRows*s.words
	s.tokens = 4 * slots
	s.lps = s.tokens + 4*maxRows
	s.topIDs = s.lps + 4*maxRows
	s.top = s.topIDs + 4*maxRows*cuda.MaxSampleTop
	s.outBytes = s.top + 4*maxRows*cuda.MaxSampleTop
	var err error
	if s.in, err = a.alloc(c, s.inBytes); err != nil {
		return nil, fmt.Errorf("gpu: sampling: %w", err)
	}
	if s.out, err = a.alloc(c, s.outBytes); err != nil {
		return nil, fmt.Errorf("gpu: sampling: %w", err)
	}
	s.hin, s.hout = make([]byte, s.inBytes), make([]byte, s.outBytes)
	return s, nil
}

// deviceSamples reports whether the device kernels cover every logits row of p, as
// core/gpurunner's predicate of the same name (drafts and token masks included here: the
// kernels verify the one and apply the other): none of the features only engine.Sampler
// applies (penalties, logit bias, min-tokens masks, prompt logprobs), at most
// cuda.MaxSampleTop alternatives, parameters the kernel takes, and no logits capture.
func (r *GPURunner) deviceSamples(p *engine.BatchPlan) bool {
	if r.hostSampling || r.capturing || len(p.LogitBiasStart) > 0 || len(p.StopIDsStart) > 0 || len(p.HistoryStart) > 0 || len(p.PromptLogprobs) > 0 {
		return false
	}
	for i := range p.ReqIDs {
		if p.Logprobs[i] > cuda.MaxSampleTop {
			return false
		}
		if len(p.PresencePenalty) > 0 && (p.PresencePenalty[i] != 0 || p.FrequencyPenalty[i] != 0 || p.RepetitionPenalty[i] != 0 && p.RepetitionPenalty[i] != 1) {
			return false
		}
		if p.Temperature[i] < 0 || math.IsInf(float64(p.Temperature[i]), 0) || !(p.TopP[i] >= 0 && p.TopP[i] <= 1) ||
			!(p.MinP[i] >= 0 && p.MinP[i] <= 1) || p.TopK[i] < 0 {
			return false // the host's sampler has its own answer to parameters the kernel refuses
		}
	}
	return true
}

// CaptureLogits is cpurunner.Runner's: while fn is set every step runs on the host,
// where the logits rows are.
func (r *GPURunner) CaptureLogits(fn func(row cpurunner.LogitsRow)) {
	r.capturing = fn != nil
	r.Runner.CaptureLogits(fn)
}

// Execute runs plan: sampled (and its drafts verified) on the device when deviceSamples,
// else through cpurunner on the host's copy of the logits.
func (r *GPURunner) Execute(ctx context.Context, p *engine.BatchPlan) (engine.StepResult, error) {
	if !r.deviceSamples(p) {
		r.Stats.HostSampled++
		return r.Runner.Execute(ctx, p)
	}
	if err := ctx.Err(); err != nil {
		return engine.StepResult{}, err
	}
	if err := r.dev.Do(func(c *cudart.Ctx) error { return r.sampleStep(c, p) }); err != nil {
		return engine.StepResult{}, fmt.Errorf("%s: %w", Name, err)
	}
	r.Stats.DeviceSampled++
	if r.drafts > 0 {
		if err := r.drafter.Draft(p, &r.res); err != nil {
			return engine.StepResult{}, fmt.Errorf("%s: %w", Name, err)
		}
	}
	return r.res, nil
}

// sampleStep is forward's step with its logits rows sampled and verified on the device
// into r.res.
func (r *GPURunner) sampleStep(c *cudart.Ctx, p *engine.BatchPlan) error {
	seqs, toks, err := r.seqs.Bind(c, p)
	if err != nil {
		return err
	}
	want := p.LogitsIndices
	if want == nil {
		want = noRows
	}
	var mir *mirrorStep
	if r.kv != nil {
		if mir, err = newMirrorStep(r.kv, p, r.g.s); err != nil {
			return err
		}
	}
	if r.drafts > 0 {
		r.stepSeqs, r.mir = seqs, mir
		if err := r.saveDrafts(c, p, seqs, mir); err != nil {
			return err
		}
	}
	b := p.NumSeqs()
	r.res.Reset(b)
	rows, err := r.g.run(c, seqs, toks, want, mir)
	if err != nil || rows == 0 {
		return err
	}
	return r.g.smp.sample(c, r.g, p, rows, &r.res)
}

// sample samples the step's rows logits rows (w.logits) and verifies p's drafts on the
// device, and fills res from what comes back.
func (s *gpuSampling) sample(c *cudart.Ctx, g *gpuModel, p *engine.BatchPlan, rows int, res *engine.StepResult) error {
	vocab, b := g.m.Config.VocabSize, p.NumSeqs()
	if rows != int(p.LogitsStart[b]) {
		return fmt.Errorf("gpu: sampling: %d logits rows, the plan's sequences have %d", rows, p.LogitsStart[b])
	}
	le := binary.LittleEndian
	s.params = s.params[:0]
	masked := len(p.TokenMask) > 0
	for i := range b {
		lo, hi := int(p.LogitsStart[i]), int(p.LogitsStart[i+1])
		k := int(p.NumDrafts[i])
		qe := int(p.QueryStart[i+1])
		var ma, mb int
		if masked {
			ma, mb = int(p.TokenMaskStart[i]), int(p.TokenMaskStart[i+1])
			if mb > ma && mb-ma != (hi-lo)*s.words {
				return fmt.Errorf("gpu: sampling: sequence %d has %d token mask words for %d logits rows, the vocabulary of %d needs %d a row", i, mb-ma, hi-lo, vocab, s.words)
			}
		}
		for j := lo; j < hi; j++ {
			d := j - lo
			s.params = append(s.params, cuda.SampleParams{Temperature: p.Temperature[i], TopP: p.TopP[i], MinP: p.MinP[i],
				TopK: p.TopK[i], Seed: p.Seed[i], Pos: p.Positions[p.LogitsIndices[j]] + 1, Logprobs: p.Logprobs[i]})
			draft := int32(-1)
			if d < k {
				draft = p.Tokens[qe-k+d]
			}
			le.PutUint32(s.hin[s.drafts+4*j:], uint32(draft))
			start := int32(-1)
			if mb > ma {
				start = int32(ma + d*s.words)
			}
			le.PutUint32(s.hin[s.maskAt+4*j:], uint32(start))
		}
		le.PutUint32(s.hin[s.starts+4*i:], uint32(lo))
	}
	le.PutUint32(s.hin[s.starts+4*b:], uint32(rows))
	if _, err := cuda.PutSampleParams(s.hin, s.params); err != nil {
		return err
	}
	n := s.mask
	if masked {
		if 4*len(p.TokenMask) > s.inBytes-s.mask {
			return fmt.Errorf("gpu: sampling: %d token mask words exceed the %d the runner holds", len(p.TokenMask), (s.inBytes-s.mask)/4)
		}
		for k, w := range p.TokenMask {
			le.PutUint32(s.hin[s.mask+4*k:], w)
		}
		n += 4 * len(p.TokenMask)
	}
	anyLP, anyTop := false, false
	for _, l := range p.Logprobs {
		anyLP, anyTop = anyLP || l >= 0, anyTop || l > 0
	}
	at := func(off int) cudart.DevicePtr { return s.in + cudart.DevicePtr(off) }
	out := func(off int) cudart.DevicePtr { return s.out + cudart.DevicePtr(off) }
	if err := c.CopyHtoDAsync(s.in, s.hin[:n], g.s); err != nil {
		return err
	}
	sp := cuda.Sample{Tokens: out(s.tokens), Logprobs: out(s.lps), Logits: g.w.logits, Params: s.in, Rows: rows, Vocab: vocab}
	if anyTop {
		sp.TopIDs, sp.TopLogprobs, sp.MaxTop = out(s.topIDs), out(s.top), cuda.MaxSampleTop
	}
	if masked {
		sp.TokenMask, sp.MaskStart, sp.MaskWords = at(s.mask), at(s.maskAt), s.words
	}
	if err := g.kk.Sample(c, g.s, sp); err != nil {
		return err
	}
	vd := cuda.VerifyDrafts{Accepted: s.out, Sampled: out(s.tokens), Drafts: at(s.drafts), LogitsStart: at(s.starts), Seqs: b}
	if err := g.kk.VerifyDrafts(c, g.s, vd); err != nil {
		return err
	}
	// One copy back: the counts and tokens, and the logprobs (and alternatives) asked for.
	m := s.lps
	switch {
	case anyTop:
		m = s.outBytes
	case anyLP:
		m = s.topIDs
	}
	if err := c.CopyDtoHAsync(s.hout[:m], s.out, g.s); err != nil {
		return err
	}
	if err := c.Sync(g.s); err != nil {
		return err
	}
	return s.fill(p, vocab, anyLP, res)
}

// fill appends to res what the device's sampling gave, as cpurunner does from the host's
// sampling: per sequence its accepted tokens, their logprobs when any sequence asks, and
// the alternatives it asks for.
func (s *gpuSampling) fill(p *engine.BatchPlan, vocab int, anyLP bool, res *engine.StepResult) error {
	le := binary.LittleEndian
	i32 := func(off int) int32 { return int32(le.Uint32(s.hout[off:])) }
	f32 := func(off int) float32 { return math.Float32frombits(le.Uint32(s.hout[off:])) }
	for i := range p.NumSeqs() {
		lo, hi := int(p.LogitsStart[i]), int(p.LogitsStart[i+1])
		if lo == hi {
			continue
		}
		a := int(i32(4 * i))
		if a < 1 || a > hi-lo {
			return fmt.Errorf("gpu: sampling: the device accepted %d tokens of request %d, which has %d logits rows", a, p.ReqIDs[i], hi-lo)
		}
		res.Accepted[i] = int32(a)
		top := min(int(p.Logprobs[i]), vocab)
		for j := lo; j < lo+a; j++ {
			tok := i32(s.tokens + 4*j)
			if tok < 0 || int(tok) >= vocab {
				return fmt.Errorf("gpu: sampling: the device sampled token %d for logits row %d, outside the vocabulary of %d", tok, j, vocab)
			}
			res.Tokens = append(res.Tokens, tok)
			if anyLP {
				res.Logprobs = append(res.Logprobs, f32(s.lps+4*j))
			}
			for t := range top {
				at := 4 * (j*cuda.MaxSampleTop + t)
				res.TopTokens = append(res.TopTokens, i32(s.topIDs+at))
				res.TopLogprobs = append(res.TopLogprobs, f32(s.top+at))
			}
		}
	}
	return nil
}

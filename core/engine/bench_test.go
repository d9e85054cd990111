package engine_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// standIn returns token step%vocab for every sequence with a logits row.
type standIn struct{ res engine.StepResult }

func (m *standIn) Info() engine.RunnerInfo {
	return engine.RunnerInfo{Name: "stand-in", VocabSize: 32000, MaxContext: 1 << 20}
}

func (m *standIn) Execute(_ context.Context, p *engine.BatchPlan) (engine.StepResult, error) {
	m.res.Reset(p.NumSeqs())
	for i := 0; i < p.NumSeqs(); i++ {
		if p.LogitsStart[i+1] > p.LogitsStart[i] {
			m.res.Accepted[i] = 1
			m.res.Tokens = append(m.res.Tokens, int32(p.Step%32000))
		}
	}
	return m.res, nil
}

type nopOutput struct{}

func (nopOutput) Token(int32, *engine.TokenLogprob)               {}
func (nopOutput) Finish(engine.FinishReason, error, engine.Usage) {}

// BenchmarkDecodeStep measures one steady-state decode step of 32 or 256 sequences
// (512-token prompts, 256-token pages): Schedule, the stand-in model and Update.
func BenchmarkDecodeStep(b *testing.B) {
	for _, seqs := range []int{32, 256} {
		b.Run(strconv.Itoa(seqs), func(b *testing.B) { benchDecode(b, seqs, engine.SamplingParams{}) })
	}
}

// BenchmarkDecodeStepPenalized is BenchmarkDecodeStep with every request carrying
// penalties, a logit bias and min_tokens: the plan then carries the sampling CSR arrays
// (the token history grows with the sequences, so its buffer grows by doubling).
func BenchmarkDecodeStepPenalized(b *testing.B) {
	sp := engine.SamplingParams{PresencePenalty: 0.5, FrequencyPenalty: 0.5, RepetitionPenalty: 1.1,
		LogitBias: map[int32]float32{1: 1, 2: -1}, MinTokens: 4}
	b.Run("32", func(b *testing.B) { benchDecode(b, 32, sp) })
}

func benchDecode(b *testing.B, seqs int, extra engine.SamplingParams) {
	const promptLen, rounds = 512, 2048
	group := kvslab.GroupSpec{Name: "kv", Kind: kvslab.Full, Layers: 1, BytesPerToken: 2, PageTokens: 256}
	pages := int64(seqs * ((promptLen+rounds)/256 + 2))
	arena, err := kvslab.NewHostArena(pages * group.PageBytes())
	if err != nil {
		b.Fatal(err)
	}
	pool, err := kvslab.New(kvslab.Config{Groups: []kvslab.GroupSpec{group}, SlabBytes: 16 * group.PageBytes()}, arena)
	if err != nil {
		b.Fatal(err)
	}
	model := &standIn{}
	s, err := engine.NewScheduler(model.Info(), engine.Config{Pool: pool, MaxSeqs: seqs, MaxBatchTokens: 16384})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	fill := func(gen int) {
		for i := 0; i < seqs; i++ {
			p := make([]int32, promptLen)
			for j := range p {
				p[j] = int32((i*promptLen + j + gen) % 32000)
			}
			sp := extra
			sp.MaxTokens, sp.HasSeed = rounds+8, true
			req := engine.Request{ID: strconv.Itoa(gen*seqs + i), Prompt: p, Sampling: sp}
			if err := s.Add(req, nopOutput{}); err != nil {
				b.Fatal(err)
			}
		}
		for {
			p := s.Schedule()
			decode := p.IsDecode() && s.NumWaiting() == 0
			res, err := model.Execute(ctx, p)
			s.Update(p, res, err)
			if decode {
				break
			}
		}
	}
	gen := 0
	fill(gen)
	left := rounds
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if left == 0 {
			b.StopTimer()
			for j := 0; j < seqs; j++ {
				s.Abort(strconv.Itoa(gen*seqs + j))
			}
			gen++
			fill(gen)
			left = rounds
			b.StartTimer()
		}
		p := s.Schedule()
		res, err := model.Execute(ctx, p)
		s.Update(p, res, err)
		left--
	}
}

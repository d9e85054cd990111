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
		s.FillTokenMasks(p) // as Engine.Run does; nothing when no request is constrained
		res, err := model.Execute(ctx, p)
		s.Update(p, res, err)
		left--
	}
}

// asyncStandIn is the stand-in model declaring AsyncTokens (it ignores the tokens fed).
type asyncStandIn struct {
	standIn
	groups []kvslab.GroupSpec
}

func (m *asyncStandIn) Info() engine.RunnerInfo {
	info := m.standIn.Info()
	info.AsyncTokens, info.CacheGroups = true, m.groups
	return info
}

// BenchmarkDecodeStepAsync is one steady decode step of 32 sequences with Config.Async
// (the next plan built before the step's Update, as Engine.Run overlaps them), over full
// attention and over a hybrid cache (a sliding window and a recurrent group, which take
// the general row path and reserve every token).
func BenchmarkDecodeStepAsync(b *testing.B) {
	full := []kvslab.GroupSpec{{Name: "kv", Kind: kvslab.Full, Layers: 1, BytesPerToken: 2, PageTokens: 256}}
	hybrid := []kvslab.GroupSpec{
		{Name: "swa", Kind: kvslab.SlidingWindow, Layers: 1, BytesPerToken: 2, PageTokens: 256, Window: 512},
		{Name: "state", Kind: kvslab.Recurrent, Layers: 1, BytesPerToken: 2, PageTokens: 256, Checkpoints: 2},
	}
	for name, groups := range map[string][]kvslab.GroupSpec{"full": full, "hybrid": hybrid} {
		b.Run(name, func(b *testing.B) { benchDecodeAsync(b, 32, groups) })
	}
}

func benchDecodeAsync(b *testing.B, seqs int, groups []kvslab.GroupSpec) {
	const promptLen, warm, rounds = 512, 600, 4096
	pool, err := engine.NewHostPool(groups, int64(seqs)*int64((promptLen+warm+rounds)/256+4)*groups[0].PageBytes()*int64(len(groups)))
	if err != nil {
		b.Fatal(err)
	}
	model := &asyncStandIn{groups: groups}
	s, err := engine.NewScheduler(model.Info(), engine.Config{Pool: pool, MaxSeqs: seqs, MaxBatchTokens: 16384, Async: true})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var inflight *engine.BatchPlan
	step := func() {
		next := s.Schedule()
		res, err := model.Execute(ctx, inflight)
		if err := s.Update(inflight, res, err); err != nil {
			b.Fatal(err)
		}
		if next == nil || !s.Pending(next) {
			next = s.Schedule()
		}
		inflight = next
	}
	gen := 0
	fill := func() { // a new generation of requests, past their prompts
		if inflight != nil {
			if err := s.Rollback(inflight); err != nil {
				b.Fatal(err)
			}
		}
		for i := 0; i < seqs; i++ {
			s.Abort(strconv.Itoa((gen-1)*seqs + i))
		}
		for i := 0; i < seqs; i++ {
			p := make([]int32, promptLen)
			for j := range p {
				p[j] = int32((i*promptLen + j + gen) % 32000)
			}
			req := engine.Request{ID: strconv.Itoa(gen*seqs + i), Prompt: p, Sampling: engine.SamplingParams{MaxTokens: warm + rounds + 8, HasSeed: true}}
			if err := s.Add(req, nopOutput{}); err != nil {
				b.Fatal(err)
			}
		}
		gen++
		inflight = s.Schedule()
		for range warm {
			step()
		}
	}
	fill()
	left := rounds
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if left == 0 {
			b.StopTimer()
			fill()
			left = rounds
			b.StartTimer()
		}
		step()
		left--
	}
}

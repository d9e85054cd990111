package wire_test

import (
	"context"
	"net"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/wire"
)

// standIn is the trivial runner on the far side: token 1 for every row with logits.
type standIn struct{ res engine.StepResult }

func (m *standIn) Info() engine.RunnerInfo {
	return engine.RunnerInfo{Name: "stand-in", VocabSize: 32000, MaxContext: 1 << 20, CacheGroups: benchGroups}
}

func (m *standIn) Execute(_ context.Context, p *engine.BatchPlan) (engine.StepResult, error) {
	m.res.Reset(p.NumSeqs())
	for i := 0; i < p.NumSeqs(); i++ {
		if p.LogitsStart[i+1] > p.LogitsStart[i] {
			m.res.Accepted[i] = 1
			m.res.Tokens = append(m.res.Tokens, 1)
		}
	}
	return m.res, nil
}

type nopOutput struct{}

func (nopOutput) Token(int32, *engine.TokenLogprob)               {}
func (nopOutput) Finish(engine.FinishReason, error, engine.Usage) {}

var benchGroups = []kvslab.GroupSpec{{Name: "kv", Kind: kvslab.Full, Layers: 1, BytesPerToken: 2, PageTokens: 16}}

// BenchmarkRemoteDecode256x8k measures one steady-state decode step of 256 sequences at
// 7.7k-8.2k tokens of context (16-token pages, so ~500 pages per table): Schedule, the
// step sent over a Unix socket to a trivial Go runner, its result read back, Update.
// "inprocess" is the same loop without the protocol; "deltas" and "whole" send the page
// tables as deltas or whole. It reports the bytes sent and received per step.
func BenchmarkRemoteDecode256x8k(b *testing.B) {
	for _, mode := range []string{"inprocess", "deltas", "whole"} {
		b.Run(mode, func(b *testing.B) { benchRemoteDecode(b, mode) })
	}
}

func benchRemoteDecode(b *testing.B, mode string) {
	const seqs, promptLen, rounds = 256, 7680, 480
	var runner engine.Runner = &standIn{}
	var remote *wire.Remote
	if mode != "inprocess" {
		sock := filepath.Join(b.TempDir(), "r.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			wire.Serve(context.Background(), c, c, &standIn{}, wire.ServeOptions{})
		}()
		remote, err = wire.Dial(context.Background(), wire.Config{Spec: "unix:" + sock, WholeTables: mode == "whole"})
		if err != nil {
			b.Fatal(err)
		}
		defer remote.Close()
		runner = remote
	}
	group := benchGroups[0]
	pages := int64(seqs * ((promptLen+rounds)/16 + 2))
	arena, err := kvslab.NewHostArena(pages * group.PageBytes())
	if err != nil {
		b.Fatal(err)
	}
	pool, err := kvslab.New(kvslab.Config{Groups: benchGroups, SlabBytes: 1024 * group.PageBytes()}, arena)
	if err != nil {
		b.Fatal(err)
	}
	s, err := engine.NewScheduler(runner.Info(), engine.Config{Pool: pool, MaxSeqs: seqs, MaxBatchTokens: 65536})
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
			req := engine.Request{ID: strconv.Itoa(gen*seqs + i), Prompt: p,
				Sampling: engine.SamplingParams{MaxTokens: rounds + 8, HasSeed: true, IgnoreEOS: true}}
			if err := s.Add(req, nopOutput{}); err != nil {
				b.Fatal(err)
			}
		}
		for {
			p := s.Schedule()
			decode := p.IsDecode() && s.NumWaiting() == 0
			res, err := runner.Execute(ctx, p)
			if err != nil {
				b.Fatal(err)
			}
			s.Update(p, res, err)
			if decode {
				break
			}
		}
	}
	gen := 0
	fill(gen)
	left := rounds
	var steps0, sent0, recv0 uint64
	if remote != nil {
		steps0, sent0, recv0 = remote.Traffic()
	}
	var fillSteps, fillSent, fillRecv uint64
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if left == 0 {
			b.StopTimer()
			for j := 0; j < seqs; j++ {
				s.Abort(strconv.Itoa(gen*seqs + j))
			}
			gen++
			var st0, se0, re0 uint64
			if remote != nil {
				st0, se0, re0 = remote.Traffic()
			}
			fill(gen)
			if remote != nil {
				st1, se1, re1 := remote.Traffic()
				fillSteps, fillSent, fillRecv = fillSteps+st1-st0, fillSent+se1-se0, fillRecv+re1-re0
			}
			left = rounds
			b.StartTimer()
		}
		p := s.Schedule()
		res, err := runner.Execute(ctx, p)
		if err != nil {
			b.Fatal(err)
		}
		s.Update(p, res, err)
		left--
	}
	b.StopTimer()
	if remote != nil {
		st, se, re := remote.Traffic()
		n := float64(st - steps0 - fillSteps)
		b.ReportMetric(float64(se-sent0-fillSent)/n, "B-sent/step")
		b.ReportMetric(float64(re-recv0-fillRecv)/n, "B-recv/step")
	}
}

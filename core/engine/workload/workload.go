// Package workload generates the scheduler workloads W1 and W2 of
// docs/workloads.md exactly and replays them through an engine.Scheduler with a
// stand-in model, timing only the engine's own work.
package workload

import "fmt"

// SplitMix64 is the workloads' generator.
type SplitMix64 struct{ state uint64 }

// NewSplitMix64 returns a generator with the given seed.
func NewSplitMix64(seed uint64) *SplitMix64 { return &SplitMix64{state: seed} }

// Next returns the next 64-bit output.
func (g *SplitMix64) Next() uint64 {
	g.state += 0x9E3779B97F4A7C15
	z := g.state
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// Token returns next() % 32000.
func (g *SplitMix64) Token() int32 { return int32(g.Next() % Vocab) }

// Uniform returns a + next() % (b-a+1), inclusive.
func (g *SplitMix64) Uniform(a, b int) int { return a + int(g.Next()%uint64(b-a+1)) }

// Vocab is the workloads' vocabulary size.
const Vocab = 32000

// Request is one workload request.
type Request struct {
	Prompt    []int32
	MaxTokens int
}

// W1 is decode-heavy with a shared prefix: a 256-token prefix, then 256 requests of the
// prefix plus 256 own tokens, each with max_tokens 256.
func W1() []Request {
	g := NewSplitMix64(0)
	prefix := make([]int32, 256)
	for i := range prefix {
		prefix[i] = g.Token()
	}
	reqs := make([]Request, 256)
	for i := range reqs {
		p := append(make([]int32, 0, 512), prefix...)
		for j := 0; j < 256; j++ {
			p = append(p, g.Token())
		}
		reqs[i] = Request{Prompt: p, MaxTokens: 256}
	}
	return reqs
}

// W2 has mixed lengths: 1,024 requests, each plen = uniform(32, 2048),
// max_tokens = uniform(16, 512), then plen tokens.
func W2() []Request {
	g := NewSplitMix64(0)
	reqs := make([]Request, 1024)
	for i := range reqs {
		plen := g.Uniform(32, 2048)
		maxTokens := g.Uniform(16, 512)
		p := make([]int32, plen)
		for j := range p {
			p[j] = g.Token()
		}
		reqs[i] = Request{Prompt: p, MaxTokens: maxTokens}
	}
	return reqs
}

// ByName returns workload "W1" or "W2".
func ByName(name string) ([]Request, error) {
	switch name {
	case "W1", "w1":
		return W1(), nil
	case "W2", "w2":
		return W2(), nil
	}
	return nil, fmt.Errorf("workload: unknown workload %q (want W1 or W2)", name)
}

// Checksums are a workload's totals, as docs/workloads.md lists them.
type Checksums struct {
	Requests, PromptTokens int
	TokenSum               int64
	MaxTokensSum           int
}

// Sum computes the checksums of reqs.
func Sum(reqs []Request) Checksums {
	c := Checksums{Requests: len(reqs)}
	for _, r := range reqs {
		c.PromptTokens += len(r.Prompt)
		c.MaxTokensSum += r.MaxTokens
		for _, t := range r.Prompt {
			c.TokenSum += int64(t)
		}
	}
	return c
}

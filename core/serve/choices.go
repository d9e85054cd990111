package serve

import (
	"cmp"
	"context"
	"slices"
	"sync"

	"github.com/resin-llm/resin/core/engine"
)

// choiceGen is one engine request behind a response: candidate k of prompt p. n > 1,
// best_of and batched prompts each fan out into several, run concurrently.
type choiceGen struct {
	prompt, candidate int
	g                 *genRequest

	// Filled by runAll, or beforehand (fixed) by guide for guided_choice.
	text  string
	lps   []engine.TokenLogprob
	res   genResult
	fixed bool
}

// fanOut returns candidates generations for each prompt, prompt-major. Candidate k's
// seed is the request's seed + k, as in vLLM's parallel sampling; without a seed the
// engine draws a different one for each.
func fanOut(prompts [][]int32, base *genRequest, candidates int) []*choiceGen {
	gens := make([]*choiceGen, 0, len(prompts)*candidates)
	for p, ids := range prompts {
		for k := 0; k < candidates; k++ {
			g := *base
			g.prompt = ids
			g.choices = 0
			if k == 0 {
				g.choices = candidates // counted once per prompt (vllm:request_params_n)
			}
			if g.sampling.HasSeed {
				g.sampling.Seed += uint64(k)
			}
			gens = append(gens, &choiceGen{prompt: p, candidate: k, g: &g})
		}
	}
	return gens
}

// runAll runs every generation to its end, concurrently. The first failure cancels the
// others and is returned. Guided generations are all fixed already (guide answers every
// one), so there is nothing to run.
func (s *Server) runAll(ctx context.Context, gens []*choiceGen) error {
	run := func(ctx context.Context, c *choiceGen) error {
		var err error
		c.text, c.lps, c.res, err = s.generateAll(ctx, c.g)
		return err
	}
	switch {
	case gens[0].fixed:
		return nil
	case len(gens) == 1:
		return run(ctx, gens[0]) // no goroutine for the common single choice
	}
	return s.each(ctx, gens, run)
}

// produce runs c's generation, calling emit as text becomes final; a fixed one (guided
// choice) is emitted whole.
func (s *Server) produce(ctx context.Context, c *choiceGen, emit func(delta) error) (genResult, error) {
	if !c.fixed {
		return s.generate(ctx, c.g, emit)
	}
	d := delta{text: c.text, logprobs: c.lps}
	for _, lp := range c.lps {
		d.tokens = append(d.tokens, lp.Token)
	}
	return c.res, emit(d)
}

// each calls fn for every generation on its own goroutine and waits for them all; the
// first error cancels the context the others run under and is returned.
func (s *Server) each(ctx context.Context, gens []*choiceGen, fn func(context.Context, *choiceGen) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for _, c := range gens {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(ctx, c); err != nil {
				once.Do(func() { first = err; cancel() })
			}
		}()
	}
	wg.Wait()
	return first
}

// best keeps, for each prompt, the n candidates with the highest cumulative logprob
// (best_of), in that order; with as many candidates as choices it keeps them all, in
// candidate order. The result is prompt-major: choice index = position.
func best(gens []*choiceGen, prompts, n, candidates int) []*choiceGen {
	if candidates == n {
		return gens
	}
	out := make([]*choiceGen, 0, prompts*n)
	for p := 0; p < prompts; p++ {
		group := slices.Clone(gens[p*candidates : (p+1)*candidates])
		slices.SortStableFunc(group, func(a, b *choiceGen) int { return cmp.Compare(b.res.cumLogprob, a.res.cumLogprob) })
		out = append(out, group[:n]...)
	}
	return out
}

// totalUsage adds up a response's usage: each prompt once (its first candidate's cached
// tokens), the completion tokens of every choice returned.
func totalUsage(prompts [][]int32, chosen []*choiceGen, all []*choiceGen) engine.Usage {
	var u engine.Usage
	for _, p := range prompts {
		u.PromptTokens += len(p)
	}
	for _, c := range chosen {
		u.CompletionTokens += c.res.usage.CompletionTokens
	}
	for _, c := range all {
		if c.candidate == 0 {
			u.CachedTokens += c.res.usage.CachedTokens
		}
	}
	return u
}

// choiceStream serialises the chunks of concurrent generations into one event stream.
type choiceStream struct {
	mu  sync.Mutex
	sse *sseWriter
}

func (cs *choiceStream) send(v any) error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.sse.send(v)
}

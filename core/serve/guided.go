package serve

import (
	"cmp"
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/resin-llm/resin/core/engine"
)

// guided_choice on a runner whose sampler applies no token masks (with masks it is a
// choice grammar, structured.go): the answer is exactly one of the given strings, decoded
// as vLLM's guided decoding does, token by token with every token that leaves the choices
// masked. The
// model's distributions along every choice come from scoring prompt+choice+EOS once per
// choice (engine prompt logprobs, one engine request each); the walk down the token trie
// of the choices then applies temperature, top-k, top-p and min-p to the allowed tokens
// at each step and draws with the choice's seed. Ending is the EOS token, allowed where a
// choice is complete. Choices are tokenized on their own (the canonical tokenization).

const maxGuidedChoices = 64

// parseGuidedChoice reads guided_choice: nil when absent.
func parseGuidedChoice(raw json.RawMessage) ([]string, error) {
	if absent(raw) {
		return nil, nil
	}
	var choices []string
	if err := json.Unmarshal(raw, &choices); err != nil {
		return nil, invalid("guided_choice", "guided_choice must be an array of strings.")
	}
	switch {
	case len(choices) == 0:
		return nil, invalid("guided_choice", "guided_choice must hold at least one string.")
	case len(choices) > maxGuidedChoices:
		return nil, invalid("guided_choice", "guided_choice holds %d strings; at most %d are allowed.", len(choices), maxGuidedChoices)
	case slices.Contains(choices, ""):
		return nil, invalid("guided_choice", "guided_choice strings must not be empty.")
	}
	return choices, nil
}

// refuseWithGuided names the first field set that guided_choice does not combine with.
func (p *commonParams) refuseWithGuided(stops []string, extra map[string]bool) error {
	for name, set := range map[string]bool{
		"stop": len(stops) > 0, "stop_token_ids": len(p.StopTokenIDs) > 0, "presence_penalty": p.PresencePenalty != nil && *p.PresencePenalty != 0,
		"frequency_penalty": p.FrequencyPenalty != nil && *p.FrequencyPenalty != 0, "logit_bias": len(p.LogitBias) > 0,
		"repetition_penalty": p.RepetitionPenalty != nil && *p.RepetitionPenalty != 1, "min_tokens": p.MinTokens != nil && *p.MinTokens != 0,
	} {
		if set {
			return invalid(name, "%s cannot be combined with guided_choice.", name)
		}
	}
	for name, set := range extra {
		if set {
			return invalid(name, "%s cannot be combined with guided_choice.", name)
		}
	}
	return nil
}

// trieNode is a node of the choices' token trie: the model's logprob of each allowed next
// token (with its scoring entry), and of EOS where a choice ends here.
type trieNode struct {
	next  []trieEdge
	ends  bool
	eosLp float32
}

type trieEdge struct {
	lp    engine.TokenLogprob
	child *trieNode
}

// guide answers every generation of gens with one of choices: it scores the choices
// after each prompt, then walks the trie once per generation. The generations are left
// finished (fixed), as if the engine had produced them.
func (s *Server) guide(ctx context.Context, gens []*choiceGen, prompts [][]int32, choices []string) error {
	ids := make([][]int32, len(choices))
	for i, c := range choices {
		t, err := s.tok.Encode(c, false)
		if err != nil || len(t) == 0 {
			return invalid("guided_choice", "guided_choice string %q does not tokenize.", c)
		}
		ids[i] = t
	}
	eos := int32(-1)
	if e := s.eng.Info().EOS; len(e) > 0 {
		eos = e[0]
	}
	for p, prompt := range prompts {
		var group []*choiceGen
		for _, c := range gens {
			if c.prompt == p {
				group = append(group, c)
			}
		}
		root, err := s.scoreChoices(ctx, prompt, ids, eos, group[0].g.sampling.TopLogprobs)
		if err != nil {
			return err
		}
		for _, c := range group {
			c.walk(root, eos, s)
		}
	}
	return nil
}

// scoreChoices scores prompt+choice+EOS for every choice concurrently and returns the
// trie of the choices with the model's logprobs along it.
func (s *Server) scoreChoices(ctx context.Context, prompt []int32, ids [][]int32, eos int32, top int) (*trieNode, error) {
	scores := make([][]engine.TokenLogprob, len(ids))
	jobs := make([]*choiceGen, len(ids))
	for i := range ids {
		jobs[i] = &choiceGen{candidate: i}
	}
	err := s.each(ctx, jobs, func(ctx context.Context, c *choiceGen) error {
		full := append(slices.Clone(prompt), ids[c.candidate]...)
		if eos >= 0 {
			full = append(full, eos)
		}
		sp := engine.SamplingParams{MaxTokens: 1, PromptLogprobs: true, Logprobs: true, TopLogprobs: top, IgnoreEOS: true}
		st, err := s.eng.Submit(ctx, engine.Request{Prompt: full, Sampling: sp})
		if err != nil {
			return fromEngine(err)
		}
		for {
			ev, err := st.Recv(ctx)
			if err != nil {
				s.eng.Abort(st.ID())
				return err
			}
			if ev.PromptLogprobs != nil {
				scores[c.candidate] = ev.PromptLogprobs[len(prompt)-1:] // entry k scores token k+1
			}
			if ev.Finish != engine.FinishNone {
				if ev.Finish == engine.FinishError || ev.Finish == engine.FinishAbort {
					return internal(ev.Err)
				}
				return nil
			}
		}
	})
	if err != nil {
		return nil, err
	}
	root := &trieNode{}
	for i, t := range ids {
		n := root
		for j, tok := range t {
			k := slices.IndexFunc(n.next, func(e trieEdge) bool { return e.lp.Token == tok })
			if k < 0 {
				n.next = append(n.next, trieEdge{lp: scores[i][j], child: &trieNode{}})
				k = len(n.next) - 1
			}
			n = n.next[k].child
		}
		n.ends = true
		if eos >= 0 {
			n.eosLp = scores[i][len(t)].Logprob
		}
	}
	return root, nil
}

// walk draws one choice down the trie with c's sampling parameters and fills c as a
// finished generation: the choice's text, its tokens' logprobs, finish reason stop.
func (c *choiceGen) walk(root *trieNode, eos int32, s *Server) {
	sp := &c.g.sampling
	seed := sp.Seed
	if !sp.HasSeed {
		seed = rand.Uint64()
	}
	rng := rand.New(rand.NewPCG(seed, 0x9E3779B97F4A7C15))
	var toks []int32
	var lps []engine.TokenLogprob
	for n := root; ; {
		type option struct {
			lp  float64
			bit int // index into n.next, or -1 for EOS
		}
		opts := make([]option, 0, len(n.next)+1)
		for k, e := range n.next {
			opts = append(opts, option{float64(e.lp.Logprob), k})
		}
		if n.ends {
			if len(n.next) == 0 || eos < 0 {
				break
			}
			opts = append(opts, option{float64(n.eosLp), -1})
		}
		slices.SortStableFunc(opts, func(a, b option) int { return cmp.Compare(b.lp, a.lp) })
		pick := opts[0]
		if sp.Temperature > 0 && len(opts) > 1 {
			if sp.TopK > 0 && sp.TopK < len(opts) {
				opts = opts[:sp.TopK]
			}
			w := make([]float64, len(opts))
			var sum float64
			for k, o := range opts {
				w[k] = math.Exp((o.lp - opts[0].lp) / float64(sp.Temperature))
				sum += w[k]
			}
			if sp.MinP > 0 {
				for k := range w {
					if w[k] < float64(sp.MinP)*w[0] {
						sum -= w[k]
						w[k] = 0
					}
				}
			}
			if sp.TopP > 0 && sp.TopP < 1 {
				var acc float64
				for k := range w {
					acc += w[k]
					if acc >= float64(sp.TopP)*sum {
						for j := k + 1; j < len(w); j++ {
							w[j] = 0
						}
						sum = acc
						break
					}
				}
			}
			u := rng.Float64() * sum
			for k, x := range w {
				if u < x || k == len(w)-1 {
					pick = opts[k]
					break
				}
				u -= x
			}
		}
		if pick.bit < 0 {
			break
		}
		e := n.next[pick.bit]
		toks = append(toks, e.lp.Token)
		lps = append(lps, e.lp)
		n = e.child
	}
	c.text = s.tok.Decode(toks, c.g.skipSpecial)
	c.lps = lps
	generated := len(toks)
	if eos >= 0 {
		generated++ // EOS ends the choice, as guided decoding generates it
	}
	c.res = genResult{finish: "stop", usage: engine.Usage{PromptTokens: len(c.g.prompt), CompletionTokens: generated}}
	for _, lp := range lps {
		c.res.cumLogprob += float64(lp.Logprob)
	}
	c.fixed = true
}

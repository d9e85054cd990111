package serve

import (
	"context"
	"net/http"
	"time"
)

// defaultCompletionTokens is OpenAI's max_tokens default for /v1/completions.
const defaultCompletionTokens = 16

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) error {
	var req completionRequest
	req.Prompt.maxTokens = s.prompts.maxContext
	if err := decodeBody(r.Body, &req); err != nil {
		return err
	}
	if err := s.checkModel(req.Model); err != nil {
		return err
	}
	s.warnIgnored(r, req.sent())
	if req.Suffix != nil && *req.Suffix != "" {
		return unsupported("suffix", "suffix")
	}
	n, candidates, err := req.choices(req.BestOf)
	if err != nil {
		return err
	}
	// max_tokens 0 with echo scores the prompt and generates nothing (the legacy
	// loglikelihood idiom): one token is generated for the prompt's logprobs to come,
	// and dropped.
	promptOnly := req.Echo && req.MaxCompletionTokens == nil && req.MaxTokens != nil && *req.MaxTokens == 0
	if promptOnly {
		if req.MinTokens != nil && *req.MinTokens > 0 {
			return invalid("min_tokens", "min_tokens must be 0 with max_tokens 0; got %d.", *req.MinTokens)
		}
		one := 1
		req.MaxTokens = &one
	}
	sp, stops, err := req.sampling(defaultCompletionTokens)
	if err != nil {
		return err
	}
	if err := s.checkTokenIDs(&sp); err != nil {
		return err
	}
	view := logprobView{asIDs: req.ReturnTokensAsTokenIDs, skipSpecial: req.skipSpecial()}
	if req.Logprobs != nil {
		if *req.Logprobs < 0 || *req.Logprobs > 5 {
			return invalid("logprobs", "logprobs must be in [0, 5]; got %d.", *req.Logprobs)
		}
		sp.Logprobs, sp.TopLogprobs, view.top = true, *req.Logprobs, *req.Logprobs
	}
	promptTop, err := req.promptLogprobs()
	if err != nil {
		return err
	}
	if promptTop >= 0 || req.Echo && sp.Logprobs {
		// The echoed prompt's tokens carry logprobs too; prompt_logprobs lists them apart.
		sp.PromptLogprobs, sp.Logprobs, sp.TopLogprobs = true, true, max(sp.TopLogprobs, promptTop)
	}
	var con *structured
	guided, err := s.guidedRequest(&req.commonParams, &con)
	if err != nil {
		return err
	}
	if guided != nil {
		if err := req.refuseWithGuided(stops, map[string]bool{"echo": req.Echo, "best_of": candidates > n, "prompt_logprobs": promptTop >= 0}); err != nil {
			return err
		}
	}
	inputs := req.Prompt.inputs
	if inputs == nil {
		return invalid("prompt", "prompt is required.")
	}
	if len(inputs)*candidates > maxSequences {
		return invalid("n", "%d prompts x %d candidates exceed the %d sequences one request may ask for.", len(inputs), candidates, maxSequences)
	}
	addSpecial := req.AddSpecialTokens == nil || *req.AddSpecialTokens
	prompts := make([][]int32, len(inputs))
	for i := range inputs {
		if prompts[i], err = s.promptIDs(&inputs[i], req.Echo, addSpecial); err != nil {
			return err
		}
	}
	base := &genRequest{sampling: sp, stops: stops, skipSpecial: req.skipSpecial(), includeStop: req.IncludeStopStrInOutput}
	if candidates > n {
		base.sampling.Logprobs = true // best_of ranks by cumulative logprob
	}
	if base.grammar, err = s.compile(con); err != nil {
		return err
	}
	gens := fanOut(prompts, base, candidates)
	if guided != nil {
		if err := s.guide(r.Context(), gens, prompts, guided); err != nil {
			return err
		}
	}
	id, created := newID("cmpl-"), time.Now().Unix()
	echo := func(c *choiceGen) string {
		if req.Echo {
			return inputs[c.prompt].text
		}
		return ""
	}
	out := completionOutput{logprobs: req.Logprobs != nil, view: view, promptOnly: promptOnly, echo: echo}
	if req.Stream {
		return s.streamCompletion(w, r, gens, prompts, &req, id, created, out)
	}
	if err := s.runAll(r.Context(), gens); err != nil {
		return err
	}
	if promptOnly {
		for _, c := range gens {
			c.text, c.lps = "", nil
			c.res.finish, c.res.usage.CompletionTokens = "length", 0
		}
	}
	chosen := best(gens, len(prompts), n, candidates)
	choices := make([]completionChoice, len(chosen))
	for i, c := range chosen {
		e := echo(c)
		choices[i] = completionChoice{Index: i, Text: e + c.text, FinishReason: &c.res.finish}
		if out.logprobs {
			var echoLps *completionLogprobs
			if req.Echo {
				echoLps = s.echoLogprobs(c.g.prompt, e, c.res.promptLogprobs, view)
			}
			lps, _ := s.completionLogprobs(c.lps, len(e), view)
			choices[i].Logprobs = echoLps.join(lps)
		}
		if promptTop >= 0 {
			choices[i].PromptLogprobs = s.promptLogprobsOf(c.g.prompt, c.res.promptLogprobs, promptTop)
		}
	}
	writeJSON(w, http.StatusOK, completionResponse{envelope: newEnvelope(id, "text_completion", created, s.modelName(req.Model)),
		Choices: choices, Usage: usageOf(totalUsage(prompts, chosen, gens))})
	return nil
}

// completionOutput is how a completion's choices are written: with logprobs or not, shown
// as view says; whether generated tokens are dropped (max_tokens 0 with echo); the
// echoed prompt text of a choice.
type completionOutput struct {
	logprobs   bool
	view       logprobView
	promptOnly bool
	echo       func(*choiceGen) string
}

// promptIDs tokenizes a text prompt (adding the tokenizer's special tokens, BOS, when
// addSpecial), or, for token ids, checks them against the vocabulary and decodes the
// text echo needs.
func (s *Server) promptIDs(p *promptInput, echo, addSpecial bool) ([]int32, error) {
	if p.ids != nil {
		vocab := s.eng.Info().VocabSize
		for i, id := range p.ids {
			if id < 0 || int(id) >= vocab {
				return nil, invalid("prompt", "The token-id prompt's token %d at position %d is outside the vocabulary [0, %d).", id, i, vocab)
			}
		}
		if echo {
			p.text = s.tok.Decode(p.ids, false)
		}
		return p.ids, nil
	}
	ids, err := s.encodePrompt(p.text, addSpecial, "prompt")
	if err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, invalid("prompt", "The prompt is empty.")
	}
	return ids, nil
}

// streamCompletion streams every generation's text as it becomes final, each chunk
// carrying its choice's index (prompt × n + k), then a finish chunk per choice, the
// usage chunk when asked, and [DONE]. With continuous usage stats every chunk carries
// its choice's usage so far.
func (s *Server) streamCompletion(w http.ResponseWriter, r *http.Request, gens []*choiceGen, prompts [][]int32, req *completionRequest, id string, created int64, out completionOutput) error {
	cs := &choiceStream{sse: newSSE(w)}
	head := newEnvelope(id, "text_completion", created, s.modelName(req.Model))
	continuous := req.continuousUsage()
	chunk := func(c *choiceGen, index int, text string, lp *completionLogprobs, finish *string, generated int) completionResponse {
		resp := completionResponse{envelope: head, Choices: []completionChoice{{Index: index, Text: text, Logprobs: lp, FinishReason: finish}}}
		if continuous {
			resp.Usage = usageSoFar(len(c.g.prompt), generated)
		}
		return resp
	}
	err := s.each(r.Context(), gens, func(ctx context.Context, c *choiceGen) error {
		index := c.prompt*len(gens)/len(prompts) + c.candidate
		e := out.echo(c)
		offset := len(e)
		first := true
		generated := 0
		res, err := s.produce(ctx, c, func(d delta) error {
			if out.promptOnly {
				d.text, d.tokens, d.logprobs = "", nil, nil
			}
			generated += len(d.tokens)
			text := d.text
			if first {
				text, first = e+text, false
			}
			if text == "" && len(d.logprobs) == 0 && d.promptLogprobs == nil {
				return nil
			}
			var lp *completionLogprobs
			if out.logprobs {
				if d.promptLogprobs != nil {
					lp = s.echoLogprobs(c.g.prompt, e, d.promptLogprobs, out.view)
				}
				var lps *completionLogprobs
				// The offset follows the tokens, not the text sent so far: a token
				// holding part of a character is sent before its text is.
				lps, offset = s.completionLogprobs(d.logprobs, offset, out.view)
				lp = lp.join(lps)
			}
			return cs.send(chunk(c, index, text, lp, nil, generated))
		})
		if err != nil {
			return err
		}
		if out.promptOnly {
			res.finish, res.usage.CompletionTokens = "length", 0
		}
		c.res = res
		return cs.send(chunk(c, index, "", nil, &c.res.finish, c.res.usage.CompletionTokens))
	})
	if err != nil {
		return cs.sse.abort(r.Context(), err)
	}
	if req.includeUsage() {
		_ = cs.send(completionResponse{envelope: head, Choices: []completionChoice{}, Usage: usageOf(totalUsage(prompts, gens, gens))})
	}
	_ = cs.sse.done()
	return nil
}

// modelName is the name to answer with: the one asked for, or the served model's.
func (s *Server) modelName(asked string) string {
	if asked != "" {
		return asked
	}
	return s.cfg.Model
}

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
	if err := decodeBody(r.Body, &req); err != nil {
		return err
	}
	if err := s.checkModel(req.Model); err != nil {
		return err
	}
	if req.Suffix != nil && *req.Suffix != "" {
		return unsupported("suffix", "suffix")
	}
	n, candidates, err := req.choices(req.BestOf)
	if err != nil {
		return err
	}
	sp, stops, err := req.sampling(defaultCompletionTokens)
	if err != nil {
		return err
	}
	if req.Logprobs != nil {
		if *req.Logprobs < 0 || *req.Logprobs > 5 {
			return invalid("logprobs", "logprobs must be in [0, 5]; got %d.", *req.Logprobs)
		}
		sp.Logprobs, sp.TopLogprobs = true, *req.Logprobs
	}
	if req.Echo && sp.Logprobs {
		sp.PromptLogprobs = true // the echoed prompt's tokens carry logprobs too
	}
	guided, err := parseGuidedChoice(req.GuidedChoice)
	if err != nil {
		return err
	}
	if guided != nil {
		if err := req.refuseWithGuided(stops, map[string]bool{"echo": req.Echo, "best_of": candidates > n}); err != nil {
			return err
		}
	}
	inputs, err := parsePrompts(req.Prompt)
	if err != nil {
		return err
	}
	if len(inputs)*candidates > maxSequences {
		return invalid("n", "%d prompts x %d candidates exceed the %d sequences one request may ask for.", len(inputs), candidates, maxSequences)
	}
	prompts := make([][]int32, len(inputs))
	for i := range inputs {
		if prompts[i], err = s.promptIDs(&inputs[i], req.Echo); err != nil {
			return err
		}
	}
	base := &genRequest{sampling: sp, stops: stops, skipSpecial: req.skipSpecial(), includeStop: req.IncludeStopStrInOutput}
	if candidates > n {
		base.sampling.Logprobs = true // best_of ranks by cumulative logprob
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
	if req.Stream {
		return s.streamCompletion(w, r, gens, prompts, &req, id, created, echo)
	}
	if err := s.runAll(r.Context(), gens); err != nil {
		return err
	}
	chosen := best(gens, len(prompts), n, candidates)
	choices := make([]completionChoice, len(chosen))
	for i, c := range chosen {
		e := echo(c)
		choices[i] = completionChoice{Index: i, Text: e + c.text, FinishReason: &c.res.finish}
		if sp.Logprobs {
			var echoLps *completionLogprobs
			if req.Echo {
				echoLps = s.echoLogprobs(c.g.prompt, c.res.promptLogprobs, sp.TopLogprobs > 0)
			}
			choices[i].Logprobs = echoLps.join(s.completionLogprobs(c.lps, len(e), sp.TopLogprobs > 0))
		}
	}
	writeJSON(w, http.StatusOK, completionResponse{envelope: newEnvelope(id, "text_completion", created, s.modelName(req.Model)),
		Choices: choices, Usage: usageOf(totalUsage(prompts, chosen, gens))})
	return nil
}

// promptIDs tokenizes a text prompt, or, for token ids, decodes the text echo needs.
func (s *Server) promptIDs(p *promptInput, echo bool) ([]int32, error) {
	if p.ids != nil {
		if echo {
			p.text = s.tok.Decode(p.ids, false)
		}
		return p.ids, nil
	}
	ids, err := s.encodePrompt(p.text, true, "prompt")
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
// usage chunk when asked, and [DONE].
func (s *Server) streamCompletion(w http.ResponseWriter, r *http.Request, gens []*choiceGen, prompts [][]int32, req *completionRequest, id string, created int64, echo func(*choiceGen) string) error {
	cs := &choiceStream{sse: newSSE(w)}
	head := newEnvelope(id, "text_completion", created, s.modelName(req.Model))
	chunk := func(index int, text string, lp *completionLogprobs, finish *string) completionResponse {
		return completionResponse{envelope: head, Choices: []completionChoice{{Index: index, Text: text, Logprobs: lp, FinishReason: finish}}}
	}
	err := s.each(r.Context(), gens, func(ctx context.Context, c *choiceGen) error {
		index := c.prompt*len(gens)/len(prompts) + c.candidate
		e := echo(c)
		offset := len(e)
		first := true
		res, err := s.produce(ctx, c, func(d delta) error {
			text := d.text
			if first {
				text, first = e+text, false
			}
			if text == "" && len(d.logprobs) == 0 {
				return nil
			}
			var lp *completionLogprobs
			if c.g.sampling.Logprobs {
				if d.promptLogprobs != nil {
					lp = s.echoLogprobs(c.g.prompt, d.promptLogprobs, c.g.sampling.TopLogprobs > 0)
				}
				lp = lp.join(s.completionLogprobs(d.logprobs, offset, c.g.sampling.TopLogprobs > 0))
			}
			offset += len(d.text)
			return cs.send(chunk(index, text, lp, nil))
		})
		if err != nil {
			return err
		}
		c.res = res
		return cs.send(chunk(index, "", nil, &c.res.finish))
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

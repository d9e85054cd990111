package serve

import (
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
	if req.BestOf != nil && *req.BestOf != 1 {
		return unsupported("best_of", "best_of other than 1")
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
	prompt, err := parsePrompt(req.Prompt)
	if err != nil {
		return err
	}
	ids := prompt.ids
	if ids == nil {
		if ids, err = s.encodePrompt(prompt.text, true, "prompt"); err != nil {
			return err
		}
		if len(ids) == 0 {
			return invalid("prompt", "The prompt is empty.")
		}
	} else if req.Echo {
		prompt.text = s.tok.Decode(ids, false)
	}
	g := &genRequest{prompt: ids, sampling: sp, stops: stops, skipSpecial: req.skipSpecial()}
	id, created := newID("cmpl-"), time.Now().Unix()
	echo := ""
	if req.Echo {
		echo = prompt.text
	}
	if req.Stream {
		return s.streamCompletion(w, r, g, &req, id, created, echo)
	}
	text, lps, res, err := s.generateAll(r.Context(), g)
	if err != nil {
		return err
	}
	choice := completionChoice{Text: echo + text, FinishReason: &res.finish}
	if sp.Logprobs {
		choice.Logprobs = s.completionLogprobs(lps, len(echo), sp.TopLogprobs > 0)
	}
	writeJSON(w, http.StatusOK, completionResponse{envelope: newEnvelope(id, "text_completion", created, s.modelName(req.Model)),
		Choices: []completionChoice{choice}, Usage: usageOf(res.usage)})
	return nil
}

func (s *Server) streamCompletion(w http.ResponseWriter, r *http.Request, g *genRequest, req *completionRequest, id string, created int64, echo string) error {
	sse := newSSE(w)
	head := newEnvelope(id, "text_completion", created, s.modelName(req.Model))
	chunk := func(text string, lp *completionLogprobs, finish *string) completionResponse {
		return completionResponse{envelope: head, Choices: []completionChoice{{Text: text, Logprobs: lp, FinishReason: finish}}}
	}
	offset := len(echo)
	first := true
	res, err := s.generate(r.Context(), g, func(d delta) error {
		text := d.text
		if first {
			text, first = echo+text, false
		}
		if text == "" && len(d.logprobs) == 0 {
			return nil
		}
		var lp *completionLogprobs
		if g.sampling.Logprobs {
			lp = s.completionLogprobs(d.logprobs, offset, g.sampling.TopLogprobs > 0)
		}
		offset += len(d.text)
		return sse.send(chunk(text, lp, nil))
	})
	if err != nil {
		return sse.abort(r.Context(), err)
	}
	var usage any
	if req.includeUsage() {
		usage = completionResponse{envelope: head, Choices: []completionChoice{}, Usage: usageOf(res.usage)}
	}
	sse.end(chunk("", nil, &res.finish), usage)
	return nil
}

// modelName is the name to answer with: the one asked for, or the served model's.
func (s *Server) modelName(asked string) string {
	if asked != "" {
		return asked
	}
	return s.cfg.Model
}

package serve

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/grammar"
)

// genRequest is one generation, already tokenized and validated.
type genRequest struct {
	// choices, on a prompt's first candidate, is how many are generated for the prompt
	// (n, or best_of when larger; vllm:request_params_n); 0 on the others.
	choices     int
	prompt      []int32
	sampling    engine.SamplingParams
	stops       []string
	skipSpecial bool
	// includeStop keeps the matched stop string, or the text of a stop_token_ids token,
	// at the end of the text (vLLM's include_stop_str_in_output). EOS stays out.
	includeStop bool
	// grammar constrains the output (structured.go); each engine request gets its own
	// matcher of it.
	grammar *grammar.Grammar
}

// delta is text that became final, with the tokens and logprobs generated since the last
// delta.
type delta struct {
	text     string
	tokens   []int32
	logprobs []engine.TokenLogprob
	// promptLogprobs comes once, with the first delta, when the request asked for them.
	promptLogprobs []engine.TokenLogprob
}

// genResult is how a generation ended.
type genResult struct {
	finish string // "stop" or "length"
	usage  engine.Usage
	// cumLogprob sums the logprobs of the generated tokens when they were asked for
	// (best_of ranks candidates by it).
	cumLogprob float64
	// promptLogprobs are the prompt's logprobs when they were asked for.
	promptLogprobs []engine.TokenLogprob
}

// generate submits r to the engine and calls emit with text as it becomes final (never
// inside a stop string, never half a character). ctx is the HTTP request's context:
// when the client goes away the engine aborts the request.
func (s *Server) generate(ctx context.Context, r *genRequest, emit func(delta) error) (genResult, error) {
	sp := r.sampling
	if r.grammar != nil {
		m, err := r.grammar.NewMatcher()
		if err != nil {
			return genResult{}, internal(fmt.Errorf("structured output: %w", err))
		}
		sp.Constraint = m
	}
	st, err := s.eng.Submit(ctx, engine.Request{Prompt: r.prompt, Sampling: sp})
	if err != nil {
		return genResult{}, fromEngine(err)
	}
	if r.choices > 0 {
		s.metrics.paramsN.Observe(float64(r.choices))
	}
	s.metrics.inflight.Inc()
	defer s.metrics.inflight.Dec()
	det := s.tok.NewDetokenizer(r.skipSpecial)
	stop := newStopMatcher(r.stops)
	stopIDs := s.stopIDs(r.sampling.StopTokenIDs, r.sampling.IgnoreEOS)
	generated := 0
	var cum float64
	var promptLps []engine.TokenLogprob
	var d delta
	for {
		ev, err := st.Recv(ctx)
		if err != nil {
			s.eng.Abort(st.ID())
			return genResult{}, fmt.Errorf("client went away: %w", err)
		}
		d = delta{promptLogprobs: ev.PromptLogprobs}
		if err := errors.Join(checkLogprobs(ev.Logprobs, "a"), checkLogprobs(ev.PromptLogprobs, "a prompt")); err != nil {
			s.eng.Abort(st.ID())
			return genResult{}, internal(err)
		}
		if ev.PromptLogprobs != nil {
			promptLps = ev.PromptLogprobs
		}
		hit := false
		for i, tok := range ev.Tokens {
			generated++
			d.tokens = append(d.tokens, tok)
			if i < len(ev.Logprobs) {
				d.logprobs = append(d.logprobs, ev.Logprobs[i])
				cum += float64(ev.Logprobs[i].Logprob)
			}
			last := i == len(ev.Tokens)-1
			if last && ev.Finish == engine.FinishStop && slices.Contains(stopIDs, tok) &&
				!(r.includeStop && slices.Contains(r.sampling.StopTokenIDs, tok)) {
				break // the stop token ends the text; it is not part of it
			}
			var text string
			// The text of the first min_tokens tokens can hold no stop string's end
			// (vLLM's rule): a stop string there would end the request early.
			text, hit = stop.add(det.Add(tok), generated > r.sampling.MinTokens)
			d.text += text
			if hit {
				if r.includeStop {
					d.text += stop.matched
				}
				break
			}
		}
		if hit {
			s.eng.Stop(st.ID())
			usage := engine.Usage{PromptTokens: len(r.prompt), CompletionTokens: generated, CachedTokens: ev.Usage.CachedTokens}
			if ev.Finish == engine.FinishNone {
				// Stop has ended the request: its terminal event says how much of the
				// prompt the prefix cache served.
				if last, err := st.Recv(ctx); err == nil {
					usage.CachedTokens = last.Usage.CachedTokens
				}
			}
			if err := emit(d); err != nil {
				return genResult{}, err
			}
			return genResult{finish: "stop", usage: usage, cumLogprob: cum, promptLogprobs: promptLps}, nil
		}
		if ev.Finish == engine.FinishNone {
			if len(d.tokens) > 0 {
				if err := emit(d); err != nil {
					s.eng.Abort(st.ID())
					return genResult{}, err
				}
			}
			continue
		}
		switch ev.Finish {
		case engine.FinishStop, engine.FinishLength:
			tail, hit := stop.add(det.Flush(), generated > r.sampling.MinTokens)
			d.text += tail
			if !hit {
				d.text += stop.flush()
			} else if r.includeStop {
				d.text += stop.matched
			}
			if err := emit(d); err != nil {
				return genResult{}, err
			}
			finish := ev.Finish.String()
			if hit {
				finish = "stop"
			}
			return genResult{finish: finish, usage: ev.Usage, cumLogprob: cum, promptLogprobs: promptLps}, nil
		case engine.FinishAbort:
			if ctx.Err() != nil {
				return genResult{}, fmt.Errorf("client went away: %w", ctx.Err())
			}
			if errors.Is(ev.Err, engine.ErrClosed) {
				return genResult{}, fromEngine(engine.ErrClosed)
			}
			return genResult{}, internal(fmt.Errorf("request aborted: %v", ev.Err))
		default:
			return genResult{}, internal(fmt.Errorf("generation failed: %v", ev.Err))
		}
	}
}

// generateAll runs r to its end and returns its whole text and logprobs.
func (s *Server) generateAll(ctx context.Context, r *genRequest) (string, []engine.TokenLogprob, genResult, error) {
	var text strings.Builder
	var lps []engine.TokenLogprob
	res, err := s.generate(ctx, r, func(d delta) error {
		text.WriteString(d.text)
		lps = append(lps, d.logprobs...)
		return nil
	})
	return text.String(), lps, res, err
}

// stopIDs lists the token ids whose generation ends the request with reason stop.
func (s *Server) stopIDs(extra []int32, ignoreEOS bool) []int32 {
	if ignoreEOS {
		return extra
	}
	return append(slices.Clone(s.eng.Info().EOS), extra...)
}

// stopMatcher holds back just enough text to see a stop string that spans tokens.
type stopMatcher struct {
	stops   []string
	hold    int // longest stop - 1 bytes stay pending
	pending string
	// floor is how many bytes of pending came from text a stop string may not end in
	// (that of the first min_tokens tokens): a match must end past it.
	floor   int
	matched string // the stop string found
}

func newStopMatcher(stops []string) *stopMatcher {
	m := &stopMatcher{stops: stops}
	for _, s := range stops {
		m.hold = max(m.hold, len(s)-1)
	}
	return m
}

// add takes new text and returns the text that is now final. When search is set and a
// stop string ends in the new text (it may begin in text before it), add returns the
// text before the stop string and true. Text added without search is never the end of
// a match: vLLM looks for stop strings only once min_tokens tokens are generated.
func (m *stopMatcher) add(text string, search bool) (string, bool) {
	if len(m.stops) == 0 {
		return text, false
	}
	m.pending += text
	if !search {
		m.floor = len(m.pending)
	} else {
		cut := -1
		for _, s := range m.stops {
			from := max(0, m.floor-len(s)+1)
			if i := strings.Index(m.pending[from:], s); i >= 0 && (cut < 0 || from+i < cut) {
				cut, m.matched = from+i, s
			}
		}
		if cut >= 0 {
			out := m.pending[:cut]
			m.pending, m.floor = "", 0
			return out, true
		}
	}
	n := len(m.pending) - m.hold
	for n > 0 && n < len(m.pending) && !utf8.RuneStart(m.pending[n]) {
		n--
	}
	if n <= 0 {
		return "", false
	}
	out := m.pending[:n]
	m.pending = m.pending[n:]
	m.floor = max(0, m.floor-n)
	return out, false
}

// flush returns what is still held (the generation ended without a stop string).
func (m *stopMatcher) flush() string {
	out := m.pending
	m.pending = ""
	return out
}

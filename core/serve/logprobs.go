package serve

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/resin-llm/resin/core/engine"
)

// minLogprob is what a -inf logprob is written as, as vLLM clamps it: JSON has no
// infinity (a model that masks tokens, or padded vocabulary rows, give -inf).
const minLogprob = -9999

// shownLogprob is lp as a response writes it: -inf as minLogprob.
func shownLogprob(lp float32) float32 {
	if math.IsInf(float64(lp), -1) {
		return minLogprob
	}
	return lp
}

// checkLogprobs fails on a logprob no distribution gives, NaN or above 0 (a runner whose
// logits were not finite): JSON cannot hold NaN, and a made-up number would be silently
// wrong, so the request fails naming it.
func checkLogprobs(lps []engine.TokenLogprob, what string) error {
	bad := func(lp float32) bool { return !(lp <= 0) } // NaN, +inf, > 0
	for i, lp := range lps {
		if bad(lp.Logprob) {
			return fmt.Errorf("the runner returned %s logprob %v for token %d (entry %d): its logits were not finite", what, lp.Logprob, lp.Token, i)
		}
		for _, t := range lp.Top {
			if bad(t.Logprob) {
				return fmt.Errorf("the runner returned %s top logprob %v for token %d (entry %d): its logits were not finite", what, t.Logprob, t.Token, i)
			}
		}
	}
	return nil
}

// logprobView is how a response shows logprobs: how many alternatives each token lists
// (the engine computes one count for a request's prompt and its answer, the larger of
// the two asked for), and whether tokens are shown as their text or, for vLLM's
// return_tokens_as_token_ids, as "token_id:N".
type logprobView struct {
	top   int
	asIDs bool
	// skipSpecial: the text leaves special tokens out, so their text offsets do not
	// advance (completions' text_offset).
	skipSpecial bool
}

// shown is token id as v shows it, with its bytes.
func (s *Server) shown(v logprobView, id int32) (string, []int) {
	if !v.asIDs {
		return s.tokenText(id)
	}
	t := s.label(v, id)
	b := make([]int, len(t))
	for i := range len(t) {
		b[i] = int(t[i])
	}
	return t, b
}

// label is token id as v shows it, without the bytes (completions' logprobs list none).
func (s *Server) label(v logprobView, id int32) string {
	if v.asIDs {
		return "token_id:" + strconv.Itoa(int(id))
	}
	return s.tok.Decode([]int32{id}, false)
}

// tops is lp's alternatives, as many as v shows.
func (v logprobView) tops(lp engine.TokenLogprob) []engine.TopLogprob {
	return lp.Top[:min(v.top, len(lp.Top))]
}

// chatLogprob is one entry of a chat choice's logprobs.content.
type chatLogprob struct {
	Token       string           `json:"token"`
	Logprob     float32          `json:"logprob"`
	Bytes       []int            `json:"bytes"`
	TopLogprobs []chatTopLogprob `json:"top_logprobs"`
}

type chatTopLogprob struct {
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

type chatLogprobs struct {
	Content []chatLogprob `json:"content"`
}

// completionLogprobs is the legacy completions logprobs object. With echo it starts with
// the prompt's tokens, the first of which has null logprob and top_logprobs.
type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []*float32           `json:"token_logprobs"`
	TopLogprobs   []map[string]float32 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// tokenText is a token's own text (invalid UTF-8 as U+FFFD) and its bytes.
func (s *Server) tokenText(id int32) (string, []int) {
	raw := s.tok.AppendBytes(nil, id, false)
	b := make([]int, len(raw))
	for i, c := range raw {
		b[i] = int(c)
	}
	return s.tok.Decode([]int32{id}, false), b
}

func (s *Server) chatLogprobs(lps []engine.TokenLogprob, v logprobView) *chatLogprobs {
	out := &chatLogprobs{Content: make([]chatLogprob, len(lps))}
	for i, lp := range lps {
		text, b := s.shown(v, lp.Token)
		top := v.tops(lp)
		e := chatLogprob{Token: text, Logprob: shownLogprob(lp.Logprob), Bytes: b, TopLogprobs: make([]chatTopLogprob, len(top))}
		for j, t := range top {
			tt, tb := s.shown(v, t.Token)
			e.TopLogprobs[j] = chatTopLogprob{Token: tt, Logprob: shownLogprob(t.Logprob), Bytes: tb}
		}
		out.Content[i] = e
	}
	return out
}

// completionLogprobs formats lps; offset is the text offset of the first token, end the
// offset after the last. Offsets
// are byte offsets into the choice's text, advanced by the bytes each token adds to it
// (a token holding part of a character adds its bytes, not the U+FFFD it shows as),
// also when tokens are shown as ids.
func (s *Server) completionLogprobs(lps []engine.TokenLogprob, offset int, v logprobView) (_ *completionLogprobs, end int) {
	withTop := v.top > 0
	out := &completionLogprobs{
		Tokens:        make([]string, len(lps)),
		TokenLogprobs: make([]*float32, len(lps)),
		TextOffset:    make([]int, len(lps)),
	}
	if withTop {
		out.TopLogprobs = make([]map[string]float32, len(lps))
	}
	var raw []byte
	for i, lp := range lps {
		shown := s.label(v, lp.Token)
		value := shownLogprob(lp.Logprob)
		out.Tokens[i], out.TokenLogprobs[i], out.TextOffset[i] = shown, &value, offset
		raw = s.tok.AppendBytes(raw[:0], lp.Token, v.skipSpecial)
		offset += len(raw)
		if withTop {
			top := v.tops(lp)
			m := make(map[string]float32, len(top))
			for _, t := range top {
				m[s.label(v, t.Token)] = shownLogprob(t.Logprob)
			}
			out.TopLogprobs[i] = m
		}
	}
	return out, offset
}

// echoLogprobs is the logprobs object of an echoed prompt: its first token with null
// logprob and top_logprobs, then each later token with its prompt logprob (plps[k]
// scores prompt[k+1]), text offsets into text, the echoed prompt (echoOffsets).
func (s *Server) echoLogprobs(prompt []int32, text string, plps []engine.TokenLogprob, v logprobView) *completionLogprobs {
	offsets := s.echoOffsets(prompt, text)
	out := &completionLogprobs{Tokens: []string{s.label(v, prompt[0])}, TokenLogprobs: []*float32{nil}, TextOffset: []int{0}}
	if v.top > 0 {
		out.TopLogprobs = []map[string]float32{nil}
	}
	rest, _ := s.completionLogprobs(plps, 0, v)
	for k := range rest.TextOffset {
		rest.TextOffset[k] = offsets[min(k+1, len(offsets)-1)]
	}
	return out.join(rest)
}

// echoOffsets is where each prompt token's bytes start in text, the echoed prompt. A
// token whose bytes text does not hold there (the BOS the tokenizer added to a text
// prompt) takes no room: it sits at the offset of the next.
func (s *Server) echoOffsets(prompt []int32, text string) []int {
	out := make([]int, len(prompt))
	off := 0
	var raw []byte
	for i, id := range prompt {
		out[i] = off
		raw = s.tok.AppendBytes(raw[:0], id, false)
		if strings.HasPrefix(text[off:], string(raw)) {
			off += len(raw)
		}
	}
	return out
}

// promptLogprob is one entry of vLLM's prompt_logprobs: a token's logprob, its rank
// among the alternatives (null where it is not among those computed) and its text.
type promptLogprob struct {
	Logprob      float32 `json:"logprob"`
	Rank         *int    `json:"rank"`
	DecodedToken string  `json:"decoded_token"`
}

// promptLogprobsOf is vLLM's prompt_logprobs for prompt: null for its first token, then
// for each later one a map from token id to promptLogprob holding the prompt's token
// and top alternatives (a -inf logprob written as minLogprob).
func (s *Server) promptLogprobsOf(prompt []int32, plps []engine.TokenLogprob, top int) []map[string]promptLogprob {
	if len(prompt) == 0 {
		return nil
	}
	out := make([]map[string]promptLogprob, 1, len(prompt))
	entry := func(id int32, lp float32, rank *int) (string, promptLogprob) {
		return strconv.Itoa(int(id)), promptLogprob{Logprob: shownLogprob(lp), Rank: rank, DecodedToken: s.label(logprobView{}, id)}
	}
	for _, lp := range plps {
		alts := lp.Top[:min(top, len(lp.Top))]
		m := make(map[string]promptLogprob, len(alts)+1)
		var rank *int
		for j, t := range alts {
			r := j + 1
			if t.Token == lp.Token {
				rank = &r
			}
			k, e := entry(t.Token, t.Logprob, &r)
			m[k] = e
		}
		k, e := entry(lp.Token, lp.Logprob, rank)
		m[k] = e
		out = append(out, m)
	}
	return out
}

// join appends b's entries to a (either may be nil).
func (a *completionLogprobs) join(b *completionLogprobs) *completionLogprobs {
	if a == nil {
		return b
	}
	if b == nil {
		return a
	}
	a.Tokens = append(a.Tokens, b.Tokens...)
	a.TokenLogprobs = append(a.TokenLogprobs, b.TokenLogprobs...)
	a.TextOffset = append(a.TextOffset, b.TextOffset...)
	if a.TopLogprobs != nil || b.TopLogprobs != nil {
		a.TopLogprobs = append(a.TopLogprobs, b.TopLogprobs...)
	}
	return a
}

package serve

import (
	"github.com/resin-llm/resin/core/engine"
)

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

func (s *Server) chatLogprobs(lps []engine.TokenLogprob) *chatLogprobs {
	out := &chatLogprobs{Content: make([]chatLogprob, len(lps))}
	for i, lp := range lps {
		text, b := s.tokenText(lp.Token)
		e := chatLogprob{Token: text, Logprob: lp.Logprob, Bytes: b, TopLogprobs: make([]chatTopLogprob, len(lp.Top))}
		for j, t := range lp.Top {
			tt, tb := s.tokenText(t.Token)
			e.TopLogprobs[j] = chatTopLogprob{Token: tt, Logprob: t.Logprob, Bytes: tb}
		}
		out.Content[i] = e
	}
	return out
}

// completionLogprobs formats lps; offset is the text offset of the first token.
func (s *Server) completionLogprobs(lps []engine.TokenLogprob, offset int, withTop bool) *completionLogprobs {
	out := &completionLogprobs{
		Tokens:        make([]string, len(lps)),
		TokenLogprobs: make([]*float32, len(lps)),
		TextOffset:    make([]int, len(lps)),
	}
	if withTop {
		out.TopLogprobs = make([]map[string]float32, len(lps))
	}
	for i, lp := range lps {
		text, _ := s.tokenText(lp.Token)
		out.Tokens[i], out.TokenLogprobs[i], out.TextOffset[i] = text, &lp.Logprob, offset
		offset += len(text)
		if withTop {
			m := make(map[string]float32, len(lp.Top))
			for _, t := range lp.Top {
				tt, _ := s.tokenText(t.Token)
				m[tt] = t.Logprob
			}
			out.TopLogprobs[i] = m
		}
	}
	return out
}

// echoLogprobs is the logprobs object of an echoed prompt: its first token with null
// logprob and top_logprobs, then each later token with its prompt logprob (plps[k]
// scores prompt[k+1]), text offsets from 0.
func (s *Server) echoLogprobs(prompt []int32, plps []engine.TokenLogprob, withTop bool) *completionLogprobs {
	first, _ := s.tokenText(prompt[0])
	out := &completionLogprobs{Tokens: []string{first}, TokenLogprobs: []*float32{nil}, TextOffset: []int{0}}
	if withTop {
		out.TopLogprobs = []map[string]float32{nil}
	}
	return out.join(s.completionLogprobs(plps, len(first), withTop))
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

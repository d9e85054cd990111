package toolparse

import "strings"

const (
	thinkStart = "<think>"
	thinkEnd   = "</think>"
)

// reasoningFormat reads <think>reasoning</think> ahead of the content.
type reasoningFormat struct {
	// startsThinking: the output is reasoning until </think> even without <think>
	// (DeepSeek-R1, whose template opens <think> in the prompt).
	startsThinking bool
}

type reasoningMode int

const (
	undecided reasoningMode = iota // waiting to see whether the output opens <think>
	thinking
	answering
)

// reasoningStream splits a generation into reasoning and content as it arrives.
type reasoningStream struct {
	mode          reasoningMode
	thinkingStart bool   // without an opening <think>, the output is still reasoning
	pending       string // text held back: a possible <think> or </think>
}

func (f reasoningFormat) start(prompt string) *reasoningStream {
	return &reasoningStream{thinkingStart: f.startsThinking || opensThink(prompt)}
}

// opensThink reports whether the prompt ends inside an open <think> (templates that
// start the assistant's turn with "<think>\n").
func opensThink(prompt string) bool {
	open := strings.LastIndex(prompt, thinkStart)
	return open >= 0 && open > strings.LastIndex(prompt, thinkEnd) &&
		strings.TrimSpace(prompt[open+len(thinkStart):]) == ""
}

// add reads text and returns the reasoning and the content it adds.
func (s *reasoningStream) add(text string, final bool) (reasoning, content string) {
	s.pending += text
	for {
		switch s.mode {
		case undecided:
			lead := s.pending[skipSpace(s.pending, 0):]
			switch {
			case strings.HasPrefix(lead, thinkStart):
				s.pending = lead[len(thinkStart):]
				s.mode = thinking
			case !final && strings.HasPrefix(thinkStart, lead):
				return "", "" // maybe <think>
			case s.thinkingStart:
				s.mode = thinking
			default:
				s.mode = answering
			}
		case thinking:
			if i := strings.Index(s.pending, thinkEnd); i >= 0 {
				reasoning += s.pending[:i]
				s.pending = s.pending[i+len(thinkEnd):]
				s.mode = answering
				continue
			}
			keep := 0
			if !final {
				keep = holdBack(s.pending, thinkEnd)
			}
			reasoning += s.pending[:len(s.pending)-keep]
			s.pending = s.pending[len(s.pending)-keep:]
			return reasoning, ""
		default:
			content, s.pending = s.pending, ""
			return reasoning, content
		}
	}
}

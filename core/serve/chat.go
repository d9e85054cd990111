package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/tokenizer"
)

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) error {
	var req chatRequest
	if err := decodeBody(r.Body, &req); err != nil {
		return err
	}
	if err := s.checkModel(req.Model); err != nil {
		return err
	}
	if s.chat == nil {
		return invalid("messages", "The model %q has no chat template; use /v1/completions.", s.cfg.Model)
	}
	if req.ResponseFormat != nil && req.ResponseFormat.Type != "" && req.ResponseFormat.Type != "text" {
		return unsupported("response_format", "response_format "+req.ResponseFormat.Type)
	}
	if tc := string(bytes.TrimSpace(req.ToolChoice)); tc != "" && tc != "null" && tc != `"none"` && tc != `"auto"` {
		return unsupported("tool_choice", "tool_choice other than none or auto")
	}
	sp, stops, err := req.sampling(0)
	if err != nil {
		return err
	}
	if req.TopLogprobs != nil {
		if !req.Logprobs {
			return invalid("top_logprobs", "top_logprobs requires logprobs to be true.")
		}
		if *req.TopLogprobs < 0 || *req.TopLogprobs > engine.MaxTopLogprobs {
			return invalid("top_logprobs", "top_logprobs must be in [0, %d]; got %d.", engine.MaxTopLogprobs, *req.TopLogprobs)
		}
		sp.TopLogprobs = *req.TopLogprobs
	}
	sp.Logprobs = req.Logprobs
	msgs, err := chatMessages(req.Messages)
	if err != nil {
		return err
	}
	if err := s.checkContentBytes(msgs); err != nil {
		return err
	}
	prompt, err := s.chat.Render(msgs, chatOptions(req.Tools, req.ChatTemplateKwargs, true))
	if err != nil {
		return invalid("messages", "The chat template rejected the messages: %v.", err)
	}
	ids, err := s.encodePrompt(prompt, false, "messages")
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return invalid("messages", "The rendered prompt is empty.")
	}
	n, _, err := req.choices(nil)
	if err != nil {
		return err
	}
	base := &genRequest{sampling: sp, stops: stops, skipSpecial: req.skipSpecial() && !s.keepSpecialTokens(&req), includeStop: req.IncludeStopStrInOutput}
	gens := fanOut([][]int32{ids}, base, n)
	if guided, err := parseGuidedChoice(req.GuidedChoice); err != nil {
		return err
	} else if guided != nil {
		if err := req.refuseWithGuided(stops, nil); err != nil {
			return err
		}
		if err := s.guide(r.Context(), gens, [][]int32{ids}, guided); err != nil {
			return err
		}
	}
	id, created := newID("chatcmpl-"), time.Now().Unix()
	if req.Stream {
		return s.streamChat(w, r, gens, &req, prompt, id, created)
	}
	if err := s.runAll(r.Context(), gens); err != nil {
		return err
	}
	choices := make([]chatChoice, len(gens))
	for i, c := range gens {
		choices[i] = s.chatChoiceOf(i, c, &req, prompt)
	}
	writeJSON(w, http.StatusOK, chatResponse{envelope: newEnvelope(id, "chat.completion", created, s.modelName(req.Model)),
		Choices: choices, Usage: usageOf(totalUsage([][]int32{ids}, gens, gens))})
	return nil
}

// chatChoiceOf assembles choice i of a chat response from its generation: the text as
// content, then what the tool-call and reasoning parsers read from it, then logprobs.
func (s *Server) chatChoiceOf(i int, c *choiceGen, req *chatRequest, prompt string) chatChoice {
	choice := chatChoice{Index: i, Message: chatMessage{Role: "assistant", Content: c.text}, FinishReason: c.res.finish}
	s.newChatParser(req, prompt).fill(&choice) // tool calls and reasoning (chattools.go)
	if c.g.sampling.Logprobs {
		choice.Logprobs = s.chatLogprobs(c.lps)
	}
	return choice
}

// streamChat streams every choice: a role chunk, content deltas as text becomes final
// (through the tool-call and reasoning parsers), a finish chunk, each with its index;
// then the usage chunk when asked, and [DONE].
func (s *Server) streamChat(w http.ResponseWriter, r *http.Request, gens []*choiceGen, req *chatRequest, prompt, id string, created int64) error {
	cs := &choiceStream{sse: newSSE(w)}
	head := newEnvelope(id, "chat.completion.chunk", created, s.modelName(req.Model))
	chunk := func(index int, d chatDelta, lp *chatLogprobs, finish *string) chatChunk {
		return chatChunk{envelope: head, Choices: []chatChunkChoice{{Index: index, Delta: d, Logprobs: lp, FinishReason: finish}}}
	}
	err := s.each(r.Context(), gens, func(ctx context.Context, c *choiceGen) error {
		index := c.candidate
		parse := s.newChatParser(req, prompt) // tool calls and reasoning (chattools.go)
		empty := ""
		first := true
		res, err := s.produce(ctx, c, func(d delta) error {
			if first {
				first = false
				if err := cs.send(chunk(index, chatDelta{Role: "assistant", Content: &empty}, nil, nil)); err != nil {
					return err
				}
			}
			if d.text == "" && len(d.logprobs) == 0 {
				return nil
			}
			var lp *chatLogprobs
			if c.g.sampling.Logprobs {
				lp = s.chatLogprobs(d.logprobs)
			}
			cd, ok := parse.delta(d.text)
			if !ok && lp == nil {
				return nil
			}
			return cs.send(chunk(index, cd, lp, nil))
		})
		if err != nil {
			return err
		}
		c.res = res
		if first {
			if err := cs.send(chunk(index, chatDelta{Role: "assistant", Content: &empty}, nil, nil)); err != nil {
				return err
			}
		}
		tail, finish := parse.flush(res.finish)
		if tail != nil {
			if err := cs.send(chunk(index, *tail, nil, nil)); err != nil {
				return err
			}
		}
		return cs.send(chunk(index, chatDelta{}, nil, &finish))
	})
	if err != nil {
		return cs.sse.abort(r.Context(), err)
	}
	if req.includeUsage() {
		_ = cs.send(chatChunk{envelope: head, Choices: []chatChunkChoice{}, Usage: usageOf(totalUsage([][]int32{gens[0].g.prompt}, gens, gens))})
	}
	_ = cs.sse.done()
	return nil
}

// chatOptions are the chat template's options for a request's tools and
// chat_template_kwargs, the same for generation and /tokenize so that both render the
// messages alike.
func chatOptions(tools []json.RawMessage, kwargs map[string]json.RawMessage, addGenerationPrompt bool) tokenizer.ChatOptions {
	opts := tokenizer.ChatOptions{AddGenerationPrompt: addGenerationPrompt, DecodeToolArguments: true, Extra: make(map[string]any, len(kwargs))}
	for _, t := range tools {
		opts.Tools = append(opts.Tools, t)
	}
	for k, v := range kwargs {
		opts.Extra[k] = v
	}
	return opts
}

package serve

import (
	"bytes"
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
	opts := tokenizer.ChatOptions{AddGenerationPrompt: true, Extra: make(map[string]any, len(req.ChatTemplateKwargs))}
	for _, t := range req.Tools {
		opts.Tools = append(opts.Tools, t)
	}
	for k, v := range req.ChatTemplateKwargs {
		opts.Extra[k] = v
	}
	prompt, err := s.chat.Render(msgs, opts)
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
	g := &genRequest{prompt: ids, sampling: sp, stops: stops, skipSpecial: req.skipSpecial()}
	id, created := newID("chatcmpl-"), time.Now().Unix()
	if req.Stream {
		return s.streamChat(w, r, g, &req, id, created)
	}
	text, lps, res, err := s.generateAll(r.Context(), g)
	if err != nil {
		return err
	}
	choice := chatChoice{Message: chatMessage{Role: "assistant", Content: text}, FinishReason: res.finish}
	if sp.Logprobs {
		choice.Logprobs = s.chatLogprobs(lps)
	}
	writeJSON(w, http.StatusOK, chatResponse{envelope: newEnvelope(id, "chat.completion", created, s.modelName(req.Model)),
		Choices: []chatChoice{choice}, Usage: usageOf(res.usage)})
	return nil
}

func (s *Server) streamChat(w http.ResponseWriter, r *http.Request, g *genRequest, req *chatRequest, id string, created int64) error {
	sse := newSSE(w)
	head := newEnvelope(id, "chat.completion.chunk", created, s.modelName(req.Model))
	chunk := func(d chatDelta, lp *chatLogprobs, finish *string) chatChunk {
		return chatChunk{envelope: head, Choices: []chatChunkChoice{{Delta: d, Logprobs: lp, FinishReason: finish}}}
	}
	empty := ""
	first := true
	res, err := s.generate(r.Context(), g, func(d delta) error {
		if first {
			first = false
			if err := sse.send(chunk(chatDelta{Role: "assistant", Content: &empty}, nil, nil)); err != nil {
				return err
			}
		}
		if d.text == "" && len(d.logprobs) == 0 {
			return nil
		}
		var lp *chatLogprobs
		if g.sampling.Logprobs {
			lp = s.chatLogprobs(d.logprobs)
		}
		text := d.text
		return sse.send(chunk(chatDelta{Content: &text}, lp, nil))
	})
	if err != nil {
		return sse.abort(r.Context(), err)
	}
	if first {
		if err := sse.send(chunk(chatDelta{Role: "assistant", Content: &empty}, nil, nil)); err != nil {
			return nil
		}
	}
	var usage any
	if req.includeUsage() {
		usage = chatChunk{envelope: head, Choices: []chatChunkChoice{}, Usage: usageOf(res.usage)}
	}
	sse.end(chunk(chatDelta{}, nil, &res.finish), usage)
	return nil
}

package serve

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
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
	if err := req.refuseOutputs(); err != nil {
		return err
	}
	if _, err := toolDefs(req.Tools); err != nil {
		return err
	}
	s.warnIgnored(r, req.sent())
	con, err := req.chatStructured()
	if err != nil {
		return err
	}
	if con, err = con.nativeFormat(s.parser.ToolFormat()); err != nil {
		return err
	}
	guided, err := s.guidedRequest(&req.commonParams, &con)
	if err != nil {
		return err
	}
	// add_generation_prompt defaults to true, and to false with continue_final_message,
	// which it excludes.
	addGenerationPrompt := !req.ContinueFinalMessage
	if req.AddGenerationPrompt != nil {
		if *req.AddGenerationPrompt && req.ContinueFinalMessage {
			return invalid("continue_final_message", "continue_final_message and add_generation_prompt cannot both be true.")
		}
		addGenerationPrompt = *req.AddGenerationPrompt
	}
	sp, stops, err := req.sampling(0)
	if err != nil {
		return err
	}
	if err := s.checkTokenIDs(&sp); err != nil {
		return err
	}
	view := logprobView{asIDs: req.ReturnTokensAsTokenIDs}
	if req.TopLogprobs != nil {
		if !req.Logprobs {
			return invalid("top_logprobs", "top_logprobs requires logprobs to be true.")
		}
		if *req.TopLogprobs < 0 || *req.TopLogprobs > engine.MaxTopLogprobs {
			return invalid("top_logprobs", "top_logprobs must be in [0, %d]; got %d.", engine.MaxTopLogprobs, *req.TopLogprobs)
		}
		sp.TopLogprobs, view.top = *req.TopLogprobs, *req.TopLogprobs
	}
	sp.Logprobs = req.Logprobs
	promptTop, err := req.promptLogprobs()
	if err != nil {
		return err
	}
	if promptTop >= 0 {
		sp.PromptLogprobs, sp.Logprobs, sp.TopLogprobs = true, true, max(sp.TopLogprobs, promptTop)
	}
	msgs, err := s.templateMessages(req.Messages)
	if err != nil {
		return err
	}
	if err := s.checkContentBytes(msgs); err != nil {
		return err
	}
	opts := chatOptions(req.Tools, req.ChatTemplateKwargs, addGenerationPrompt)
	opts.ContinueFinalMessage = req.ContinueFinalMessage
	if err := reasoningEffort(&opts, req.ReasoningEffort); err != nil {
		return err
	}
	prompt, err := s.chat.Render(msgs, opts)
	if err != nil {
		return invalid("messages", "The chat template rejected the messages: %v.", err)
	}
	ids, err := s.encodePrompt(prompt, req.AddSpecialTokens != nil && *req.AddSpecialTokens, "messages")
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return invalid("messages", "The rendered prompt is empty.")
	}
	// Without max_tokens the answer may fill the context; min_tokens must fit in it.
	if room := s.prompts.maxContext - len(ids); sp.MaxTokens == 0 && sp.MinTokens > room {
		return invalid("min_tokens", "min_tokens %d exceeds the %d tokens the context leaves after the %d-token prompt.", sp.MinTokens, room, len(ids))
	}
	n, _, err := req.choices(nil)
	if err != nil {
		return err
	}
	base := &genRequest{sampling: sp, stops: stops, skipSpecial: req.skipSpecial() && !s.keepSpecialTokens(&req), includeStop: req.IncludeStopStrInOutput}
	if base.grammar, err = s.compile(con); err != nil {
		return err
	}
	gens := fanOut([][]int32{ids}, base, n)
	if guided != nil {
		if err := req.refuseWithGuided(stops, map[string]bool{"prompt_logprobs": promptTop >= 0}); err != nil {
			return err
		}
		if err := s.guide(r.Context(), gens, [][]int32{ids}, guided); err != nil {
			return err
		}
	}
	out := chatOutput{role: "assistant", logprobs: req.Logprobs, view: view, oneToolCall: req.ParallelToolCalls != nil && !*req.ParallelToolCalls}
	if con != nil {
		out.forced = con.forced
	}
	if !addGenerationPrompt {
		out.role = msgs[len(msgs)-1]["role"].(string) // the answer continues the last message's turn, as in vLLM
	}
	if last := msgs[len(msgs)-1]; req.Echo && last["role"] == out.role {
		out.echo = last["content"].(string)
	}
	id, created := newID("chatcmpl-"), time.Now().Unix()
	if req.Stream {
		return s.streamChat(w, r, gens, &req, prompt, id, created, out)
	}
	if err := s.runAll(r.Context(), gens); err != nil {
		return err
	}
	choices := make([]chatChoice, len(gens))
	for i, c := range gens {
		choices[i] = s.chatChoiceOf(i, c, &req, prompt, out)
	}
	resp := chatResponse{envelope: newEnvelope(id, "chat.completion", created, s.modelName(req.Model)),
		Choices: choices, Usage: usageOf(totalUsage([][]int32{ids}, gens, gens))}
	if promptTop >= 0 {
		resp.PromptLogprobs = s.promptLogprobsOf(ids, gens[0].res.promptLogprobs, promptTop)
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

// chatOutput is how a chat answer is written: the role it answers in, the text it starts
// with (echo), whether it shows logprobs and how, and whether it keeps only the first
// tool call (parallel_tool_calls false).
type chatOutput struct {
	role        string
	echo        string
	logprobs    bool
	view        logprobView
	oneToolCall bool
	// forced is set when tool_choice forces a call: the answer is the call's JSON
	// (structured.go), turned into tool_calls instead of read by the tool-call parser.
	forced *forcedTools
}

// chatChoiceOf assembles choice i of a chat response from its generation: the text as
// content, then what the tool-call and reasoning parsers read from it, then logprobs.
func (s *Server) chatChoiceOf(i int, c *choiceGen, req *chatRequest, prompt string, out chatOutput) chatChoice {
	choice := chatChoice{Index: i, Message: chatMessage{Role: out.role, Content: c.text}, FinishReason: c.res.finish}
	if out.forced != nil {
		if calls, ok := out.forced.toolCalls(c.text); ok {
			choice.Message.Content, choice.Message.ToolCalls = "", calls
			choice.FinishReason = out.forced.finish()
		}
	} else {
		s.newChatParser(req, prompt).fill(&choice) // tool calls and reasoning (chattools.go)
	}
	choice.Message.Content = out.echo + choice.Message.Content
	if out.oneToolCall && len(choice.Message.ToolCalls) > 1 {
		choice.Message.ToolCalls = choice.Message.ToolCalls[:1]
	}
	if out.logprobs {
		choice.Logprobs = s.chatLogprobs(c.lps, out.view)
	}
	return choice
}

// streamChat streams every choice: a role chunk, the echoed text if any, content deltas
// as text becomes final (through the tool-call and reasoning parsers), a finish chunk,
// each with its index; then the usage chunk when asked, and [DONE]. With continuous
// usage stats every chunk carries its choice's usage so far.
func (s *Server) streamChat(w http.ResponseWriter, r *http.Request, gens []*choiceGen, req *chatRequest, prompt, id string, created int64, out chatOutput) error {
	cs := &choiceStream{sse: newSSE(w)}
	head := newEnvelope(id, "chat.completion.chunk", created, s.modelName(req.Model))
	continuous := req.continuousUsage()
	promptLen := len(gens[0].g.prompt)
	chunk := func(index int, d chatDelta, lp *chatLogprobs, finish *string, generated int) chatChunk {
		c := chatChunk{envelope: head, Choices: []chatChunkChoice{{Index: index, Delta: d, Logprobs: lp, FinishReason: finish}}}
		if continuous {
			c.Usage = usageSoFar(promptLen, generated)
		}
		return c
	}
	err := s.each(r.Context(), gens, func(ctx context.Context, c *choiceGen) error {
		index := c.candidate
		if out.forced != nil {
			return s.streamForced(ctx, c, cs, out, chunk)
		}
		parse := s.newChatParser(req, prompt) // tool calls and reasoning (chattools.go)
		empty := ""
		first := true
		generated := 0
		opening := func() error {
			first = false
			if err := cs.send(chunk(index, chatDelta{Role: out.role, Content: &empty}, nil, nil, 0)); err != nil {
				return err
			}
			if out.echo == "" {
				return nil
			}
			return cs.send(chunk(index, chatDelta{Content: &out.echo}, nil, nil, 0))
		}
		res, err := s.produce(ctx, c, func(d delta) error {
			if first {
				if err := opening(); err != nil {
					return err
				}
			}
			generated += len(d.tokens)
			if d.text == "" && len(d.logprobs) == 0 {
				return nil
			}
			var lp *chatLogprobs
			if out.logprobs {
				lp = s.chatLogprobs(d.logprobs, out.view)
			}
			cd, ok := parse.delta(d.text)
			if ok && out.oneToolCall {
				ok = firstCallOnly(&cd)
			}
			if !ok && lp == nil {
				return nil
			}
			return cs.send(chunk(index, cd, lp, nil, generated))
		})
		if err != nil {
			return err
		}
		c.res = res
		if first {
			if err := opening(); err != nil {
				return err
			}
		}
		tail, finish := parse.flush(res.finish)
		if tail != nil && (!out.oneToolCall || firstCallOnly(tail)) {
			if err := cs.send(chunk(index, *tail, nil, nil, res.usage.CompletionTokens)); err != nil {
				return err
			}
		}
		return cs.send(chunk(index, chatDelta{}, nil, &finish, res.usage.CompletionTokens))
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

// firstCallOnly drops from d the deltas of tool calls after the first (parallel_tool_calls
// false) and reports whether d still adds anything.
func firstCallOnly(d *chatDelta) bool {
	kept := d.ToolCalls[:0]
	for _, c := range d.ToolCalls {
		if c.Index == 0 {
			kept = append(kept, c)
		}
	}
	d.ToolCalls = kept
	return d.Content != nil || d.ReasoningContent != nil || len(d.ToolCalls) > 0
}

// reasoningEfforts are the values reasoning_effort takes (OpenAI's and vLLM's).
var reasoningEfforts = []string{"none", "minimal", "low", "medium", "high", "xhigh", "max"}

// reasoningEffort hands reasoning_effort to the chat template as vLLM does: as the
// variable reasoning_effort, and as enable_thinking (false for "none", else true); a
// variable chat_template_kwargs sets wins. The templates that read them (DeepSeek V4's,
// GLM 5's) then think as asked; others ignore them.
func reasoningEffort(opts *tokenizer.ChatOptions, raw json.RawMessage) error {
	if absent(raw) {
		return nil
	}
	var effort string
	if json.Unmarshal(raw, &effort) != nil || !slices.Contains(reasoningEfforts, effort) {
		return invalid("reasoning_effort", "reasoning_effort must be one of %s; got %s.", strings.Join(reasoningEfforts, ", "), raw)
	}
	if _, ok := opts.Extra["reasoning_effort"]; !ok {
		opts.Extra["reasoning_effort"] = effort
	}
	if _, ok := opts.Extra["enable_thinking"]; !ok {
		opts.Extra["enable_thinking"] = effort != "none"
	}
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

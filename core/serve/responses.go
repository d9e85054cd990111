package serve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/resin-llm/resin/core/serve/toolparse"
)

// POST /v1/responses, OpenAI's Responses API, as vLLM serves it without a response store:
// a request is translated into the chat completion it means (instructions as the system
// message, input items as messages, function tools and tool_choice, text.format as
// response_format, reasoning.effort, max_output_tokens as max_tokens) and answered by the
// chat route's own code, whose answer (or event stream) is translated back into a
// response object (or the response.* events). The chat route's checks therefore apply
// unchanged; an error naming a chat field is renamed to the Responses field that sent it.
//
// Not served: previous_response_id and background (both need stored responses; store is
// accepted and ignored, and every response says store false), built-in tools (web
// search, file search, computer use: only function tools), input images and files.

type responsesRequest struct {
	Model             string            `json:"model"`
	Input             json.RawMessage   `json:"input"`
	Instructions      *string           `json:"instructions"`
	MaxOutputTokens   *int              `json:"max_output_tokens"`
	Temperature       *float64          `json:"temperature"`
	TopP              *float64          `json:"top_p"`
	Stream            bool              `json:"stream"`
	Tools             []json.RawMessage `json:"tools"`
	ToolChoice        json.RawMessage   `json:"tool_choice"`
	ParallelToolCalls *bool             `json:"parallel_tool_calls"`
	Text              *struct {
		Format    json.RawMessage `json:"format"`
		Verbosity json.RawMessage `json:"verbosity"`
	} `json:"text"`
	Reasoning *struct {
		Effort  json.RawMessage `json:"effort"`
		Summary json.RawMessage `json:"summary"`
	} `json:"reasoning"`
	TopLogprobs        *int            `json:"top_logprobs"`
	Include            []string        `json:"include"`
	Truncation         *string         `json:"truncation"`
	User               string          `json:"user"`
	PreviousResponseID json.RawMessage `json:"previous_response_id"`
	Background         *bool           `json:"background"`
	MaxToolCalls       json.RawMessage `json:"max_tool_calls"`
	StreamOptions      json.RawMessage `json:"stream_options"`
	// vLLM's sampling extensions on this route, passed to the chat request as they are.
	TopK              *int     `json:"top_k"`
	MinP              *float64 `json:"min_p"`
	RepetitionPenalty *float64 `json:"repetition_penalty"`
	Seed              *int64   `json:"seed"`
	ignoredFields
}

// responsesParams maps the chat request's field names, as errors name them, to the
// Responses fields they came from.
var responsesParams = map[string]string{
	"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format",
	"reasoning_effort": "reasoning.effort", "top_logprobs": "top_logprobs",
}

func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) error {
	var req responsesRequest
	if err := decodeBody(r.Body, &req); err != nil {
		return err
	}
	chat, err := req.chatRequest()
	if err != nil {
		return err
	}
	body, err := json.Marshal(chat)
	if err != nil {
		return err
	}
	cr := r.Clone(r.Context())
	cr.Body, cr.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	rs := &responseState{req: &req, id: newID("resp_"), created: time.Now().Unix(), model: s.modelName(req.Model)}
	if req.Stream {
		st := &responsesStream{out: newSSE(w), state: rs, header: http.Header{}}
		if err := s.handleChat(st, cr); err != nil {
			return renameParam(err)
		}
		return st.err
	}
	rec := &bufferedWriter{header: http.Header{}}
	if err := s.handleChat(rec, cr); err != nil {
		return renameParam(err)
	}
	var resp chatResponse
	if err := json.Unmarshal(rec.buf.Bytes(), &resp); err != nil || len(resp.Choices) != 1 {
		return fmt.Errorf("serve: responses: the chat answer did not parse (%v): %.200s", err, rec.buf.String())
	}
	c := resp.Choices[0]
	rs.text = c.Message.Content
	if c.Message.ReasoningContent != nil {
		rs.reasoning = *c.Message.ReasoningContent
	}
	rs.calls = c.Message.ToolCalls
	rs.finish = c.FinishReason
	if c.Logprobs != nil {
		rs.logprobs = c.Logprobs.Content
	}
	rs.usage = resp.Usage
	writeJSON(w, http.StatusOK, rs.object("completed"))
	return nil
}

// renameParam gives an error from the chat route the Responses field its param came from,
// and its message the Responses names of the chat fields it mentions, whatever its param:
// a prompt too long for max_tokens is param "prompt", and its message named max_tokens,
// which a Responses client never sent. A tool's chat field tools[i].function.x is the
// Responses tool's tools[i].x.
func renameParam(err error) error {
	ae, ok := err.(*apiError)
	if !ok {
		return err
	}
	c := *ae
	if p, ok := responsesParams[ae.param]; ok {
		c.param = p
		c.message = strings.ReplaceAll(c.message, "messages'", "input's") // not "input'"
		c.message = strings.ReplaceAll(c.message, ae.param, p)
	}
	c.param = toolField.ReplaceAllString(c.param, "$1.")
	c.message = toolField.ReplaceAllString(c.message, "$1.")
	for _, f := range [...]string{"max_tokens", "response_format", "reasoning_effort"} {
		c.message = strings.ReplaceAll(c.message, f, responsesParams[f])
	}
	return &c
}

// toolField matches the chat tool's function object in a field name: tools[i].function.
var toolField = regexp.MustCompile(`(tools\[\d+\])\.function\.`)

// chatRequest is the chat completion request r means.
func (r *responsesRequest) chatRequest() (map[string]any, error) {
	switch {
	case !absent(r.PreviousResponseID):
		return nil, invalid("previous_response_id", "previous_response_id needs stored responses, which this server does not keep; send the conversation in input.")
	case r.Background != nil && *r.Background:
		return nil, invalid("background", "background responses need stored responses, which this server does not keep.")
	case r.Truncation != nil && *r.Truncation != "disabled" && *r.Truncation != "auto":
		return nil, invalid("truncation", "truncation must be \"disabled\" or \"auto\"; got %q.", *r.Truncation)
	}
	if !absent(r.StreamOptions) {
		// include_obfuscation, the Responses stream's one option, pads events against
		// side channels; this server never pads, so false and true both get what it sends.
		var o map[string]json.RawMessage
		if json.Unmarshal(r.StreamOptions, &o) != nil {
			return nil, invalid("stream_options", "stream_options must be an object.")
		}
		for k, v := range o {
			var b bool
			if k != "include_obfuscation" || (!absent(v) && json.Unmarshal(v, &b) != nil) {
				return nil, unsupported("stream_options."+k, "stream_options."+k+" on /v1/responses (only include_obfuscation, a boolean; usage is in response.completed)")
			}
		}
	}
	if !absent(r.Metadata) {
		var m map[string]string
		if json.Unmarshal(r.Metadata, &m) != nil {
			return nil, invalid("metadata", "metadata must be an object of string values.")
		}
	}
	for _, inc := range r.Include {
		if inc != "message.output_text.logprobs" && inc != "reasoning.encrypted_content" {
			return nil, invalid("include", "include %q is not served; only message.output_text.logprobs is.", inc)
		}
	}
	msgs, err := r.messages()
	if err != nil {
		return nil, err
	}
	c := map[string]any{"model": r.Model, "messages": msgs}
	put := func(k string, v any, ok bool) {
		if ok {
			c[k] = v
		}
	}
	put("max_tokens", r.MaxOutputTokens, r.MaxOutputTokens != nil)
	put("temperature", r.Temperature, r.Temperature != nil)
	put("top_p", r.TopP, r.TopP != nil)
	put("top_k", r.TopK, r.TopK != nil)
	put("min_p", r.MinP, r.MinP != nil)
	put("repetition_penalty", r.RepetitionPenalty, r.RepetitionPenalty != nil)
	put("seed", r.Seed, r.Seed != nil)
	put("user", r.User, r.User != "")
	put("parallel_tool_calls", r.ParallelToolCalls, r.ParallelToolCalls != nil)
	if r.Stream {
		c["stream"], c["stream_options"] = true, map[string]any{"include_usage": true}
	}
	if r.TopLogprobs != nil || includes(r.Include, "message.output_text.logprobs") {
		c["logprobs"] = true
		put("top_logprobs", r.TopLogprobs, r.TopLogprobs != nil)
	}
	if len(r.Tools) > 0 {
		tools := make([]any, len(r.Tools))
		for i, raw := range r.Tools {
			var t map[string]json.RawMessage
			if err := json.Unmarshal(raw, &t); err != nil {
				return nil, invalid(fmt.Sprintf("tools[%d]", i), "A tool must be an object.")
			}
			var typ string
			_ = json.Unmarshal(t["type"], &typ)
			if typ != "function" {
				return nil, invalid(fmt.Sprintf("tools[%d].type", i), "Only function tools are served; got %q.", typ)
			}
			fn := map[string]json.RawMessage{}
			for k, v := range t {
				if k != "type" {
					fn[k] = v
				}
			}
			tools[i] = map[string]any{"type": "function", "function": fn}
		}
		c["tools"] = tools
	}
	if !absent(r.ToolChoice) {
		var mode string
		if json.Unmarshal(r.ToolChoice, &mode) == nil {
			c["tool_choice"] = mode
		} else {
			var named struct {
				Type, Name string
			}
			if err := json.Unmarshal(r.ToolChoice, &named); err != nil || named.Type != "function" || named.Name == "" {
				return nil, invalid("tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}.")
			}
			c["tool_choice"] = map[string]any{"type": "function", "function": map[string]string{"name": named.Name}}
		}
	}
	if r.Text != nil && !absent(r.Text.Format) {
		var f map[string]json.RawMessage
		if err := json.Unmarshal(r.Text.Format, &f); err != nil {
			return nil, invalid("text.format", "text.format must be an object.")
		}
		var typ string
		_ = json.Unmarshal(f["type"], &typ)
		switch typ {
		case "text":
		case "json_object":
			c["response_format"] = map[string]string{"type": "json_object"}
		case "json_schema":
			js := map[string]json.RawMessage{}
			for k, v := range f {
				if k != "type" {
					js[k] = v
				}
			}
			c["response_format"] = map[string]any{"type": "json_schema", "json_schema": js}
		default:
			return nil, invalid("text.format.type", "text.format.type must be text, json_object or json_schema; got %q.", typ)
		}
	}
	if r.Reasoning != nil && !absent(r.Reasoning.Effort) {
		c["reasoning_effort"] = r.Reasoning.Effort
	}
	if r.Store != nil {
		c["store"] = r.Store
	}
	if r.Metadata != nil {
		c["metadata"] = r.Metadata
	}
	return c, nil
}

func includes(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// messages turns instructions and input into chat messages: a string input is one user
// message; items are messages (role and content, a string or input_text/output_text
// parts), function_call items (the assistant's calls) and function_call_output items
// (tool results).
func (r *responsesRequest) messages() ([]map[string]any, error) {
	var msgs []map[string]any
	if r.Instructions != nil && *r.Instructions != "" {
		msgs = append(msgs, map[string]any{"role": "system", "content": *r.Instructions})
	}
	if absent(r.Input) {
		return nil, invalid("input", "input is required.")
	}
	var text string
	if json.Unmarshal(r.Input, &text) == nil {
		return append(msgs, map[string]any{"role": "user", "content": text}), nil
	}
	var items []map[string]json.RawMessage
	if err := json.Unmarshal(r.Input, &items); err != nil {
		return nil, invalid("input", "input must be a string or a list of items.")
	}
	calls := map[string]bool{} // the call_ids of the function_call items so far
	for i, it := range items {
		param := "input[" + strconv.Itoa(i) + "]"
		if it == nil {
			return nil, invalid(param, "An input item must be an object; got null.")
		}
		// str is it[k], a string; required says a missing or empty one is an error. A value
		// of another type is one, rather than read as "": a function_call whose arguments
		// are an object would otherwise reach the model with no arguments.
		var bad error
		str := func(k string, required bool) string {
			var v string
			raw, ok := it[k]
			if ok && !absent(raw) && bad == nil {
				if te, isType := errors.AsType[*json.UnmarshalTypeError](json.Unmarshal(raw, &v)); isType {
					bad = typeMismatch(param+"."+k, te)
				}
			}
			if required && v == "" && bad == nil {
				bad = invalid(param+"."+k, "Missing required parameter: %s.%s.", param, k)
			}
			return v
		}
		typ := str("type", false)
		if bad != nil {
			return nil, bad
		}
		switch typ {
		case "", "message":
			role := str("role", false)
			if bad != nil {
				return nil, bad
			}
			switch role {
			case "user", "assistant", "system", "developer":
			default:
				return nil, invalid(param+".role", "A message's role must be user, assistant, system or developer; got %q.", role)
			}
			content, err := itemText(it["content"], param+".content")
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, map[string]any{"role": role, "content": content})
		case "function_call":
			id, name, args := str("call_id", true), str("name", true), str("arguments", false)
			if _, ok := it["arguments"]; !ok && bad == nil {
				bad = invalid(param+".arguments", "Missing required parameter: %s.arguments.", param)
			}
			if bad != nil {
				return nil, bad
			}
			calls[id] = true
			call := map[string]any{"id": id, "type": "function",
				"function": map[string]string{"name": name, "arguments": args}}
			if n := len(msgs); n > 0 && msgs[n-1]["role"] == "assistant" && msgs[n-1]["tool_calls"] != nil {
				msgs[n-1]["tool_calls"] = append(msgs[n-1]["tool_calls"].([]any), call)
			} else {
				msgs = append(msgs, map[string]any{"role": "assistant", "content": "", "tool_calls": []any{call}})
			}
		case "function_call_output":
			id := str("call_id", true)
			if bad != nil {
				return nil, bad
			}
			if !calls[id] {
				// With no stored responses the call must be in this input, as OpenAI requires.
				return nil, invalid(param+".call_id", "No function_call item before %s has call_id %q.", param, id)
			}
			if absent(it["output"]) {
				return nil, invalid(param+".output", "Missing required parameter: %s.output.", param)
			}
			out, err := itemText(it["output"], param+".output")
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, map[string]any{"role": "tool", "tool_call_id": id, "content": out})
		case "reasoning":
			// A previous turn's reasoning, sent back by clients that keep the output whole:
			// chat templates drop earlier turns' reasoning, so it is dropped here too.
		default:
			return nil, invalid(param+".type", "Input items of type %q are not served (message, function_call, function_call_output and reasoning are).", typ)
		}
	}
	if len(msgs) == 0 {
		return nil, invalid("input", "input has no messages.")
	}
	return msgs, nil
}

// itemText is a message's content: a string, or its text parts joined.
func itemText(raw json.RawMessage, param string) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", invalid(param, "Content must be a string or a list of parts.")
	}
	var b strings.Builder
	for j, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text", "summary_text", "reasoning_text":
			b.WriteString(p.Text)
		default:
			return "", invalid(param+"["+strconv.Itoa(j)+"].type", "Content parts of type %q are not served (only text).", p.Type)
		}
	}
	return b.String(), nil
}

// responseState is what a response object is built from.
type responseState struct {
	req       *responsesRequest
	id, model string
	created   int64
	text      string
	reasoning string
	calls     []toolparse.ToolCall
	logprobs  []chatLogprob // the text's tokens', when asked for
	finish    string
	usage     *usageJSON
	msgID     string
}

// output is the response's items: reasoning, the message (unless the answer is only tool
// calls), then the function calls.
func (rs *responseState) output(status string) []any {
	var out []any
	if rs.reasoning != "" {
		out = append(out, map[string]any{"type": "reasoning", "id": "rs_" + rs.id[5:], "summary": []any{},
			"content": []any{map[string]any{"type": "reasoning_text", "text": rs.reasoning}}, "status": status})
	}
	if strings.TrimSpace(rs.text) != "" || len(rs.calls) == 0 { // white space beside calls is no message
		out = append(out, rs.message(status))
	}
	for i, c := range rs.calls {
		out = append(out, functionCallItem(rs.id, i, c.ID, c.Function.Name, c.Function.Arguments, status))
	}
	return out
}

func (rs *responseState) message(status string) map[string]any {
	if rs.msgID == "" {
		rs.msgID = "msg_" + rs.id[5:]
	}
	return map[string]any{"type": "message", "id": rs.msgID, "status": status, "role": "assistant",
		"content": []any{outputText(rs.text, rs.logprobs)}}
}

// outputText is an output_text part; lp are its tokens' logprobs (include
// message.output_text.logprobs, or top_logprobs), in the chat route's shape, which is the
// Responses one: token, logprob, bytes, top_logprobs.
func outputText(text string, lp []chatLogprob) map[string]any {
	return map[string]any{"type": "output_text", "text": text, "annotations": []any{}, "logprobs": logprobsOf(lp)}
}

func logprobsOf(lp []chatLogprob) any {
	if lp == nil {
		return []any{}
	}
	return lp
}

func functionCallItem(respID string, i int, callID, name, args, status string) map[string]any {
	return map[string]any{"type": "function_call", "id": "fc_" + respID[5:] + "_" + strconv.Itoa(i), "call_id": callID,
		"name": name, "arguments": args, "status": status}
}

// object is the response object, status "in_progress" while streaming, else completed or,
// when the answer ran into max_output_tokens, incomplete.
func (rs *responseState) object(status string) map[string]any {
	r := rs.req
	var incomplete any
	if status == "completed" && rs.finish == "length" {
		status, incomplete = "incomplete", map[string]string{"reason": "max_output_tokens"}
	}
	o := map[string]any{
		"id": rs.id, "object": "response", "created_at": rs.created, "status": status, "error": nil,
		"incomplete_details": incomplete, "model": rs.model, "output": []any{},
		"instructions": r.Instructions, "max_output_tokens": r.MaxOutputTokens,
		"temperature": orOne(r.Temperature), "top_p": orOne(r.TopP), "parallel_tool_calls": r.ParallelToolCalls == nil || *r.ParallelToolCalls,
		"tool_choice": toolChoiceOf(r.ToolChoice), "tools": toolsOf(r.Tools), "text": textOf(r), "reasoning": reasoningOf(r),
		"truncation": "disabled", "store": false, "previous_response_id": nil, "metadata": metadataOf(r.Metadata), "user": userOf(r.User),
		"background": false, "service_tier": "auto",
	}
	if status != "in_progress" {
		items := "completed"
		if status == "failed" || status == "incomplete" {
			items = "incomplete" // what was generated before the failure or the limit
		}
		o["output"] = rs.output(items)
		if rs.usage != nil {
			reasoning := 0
			// cache_write_tokens, which the openai SDK's InputTokensDetails requires, counts
			// the tokens written to OpenAI's prompt cache with a retention (its details are
			// per TTL); the prefix cache here keeps blocks with none, so it writes 0 such.
			o["usage"] = map[string]any{
				"input_tokens": rs.usage.PromptTokens, "output_tokens": rs.usage.CompletionTokens, "total_tokens": rs.usage.TotalTokens,
				"input_tokens_details":  map[string]int{"cached_tokens": cachedOf(rs.usage), "cache_write_tokens": 0},
				"output_tokens_details": map[string]int{"reasoning_tokens": reasoning},
			}
		}
	}
	return o
}

// metadataOf is the request's metadata, echoed as OpenAI echoes it ({} when none was sent).
func metadataOf(raw json.RawMessage) any {
	if absent(raw) {
		return map[string]any{}
	}
	return raw
}

func userOf(u string) any {
	if u == "" {
		return nil
	}
	return u
}

func cachedOf(u *usageJSON) int {
	if u.PromptTokensDetails == nil {
		return 0
	}
	return u.PromptTokensDetails.CachedTokens
}

func orOne(v *float64) float64 {
	if v == nil {
		return 1
	}
	return *v
}

func toolChoiceOf(raw json.RawMessage) any {
	if absent(raw) {
		return "auto"
	}
	return raw
}

func toolsOf(tools []json.RawMessage) []json.RawMessage {
	if tools == nil {
		return []json.RawMessage{}
	}
	return tools
}

func textOf(r *responsesRequest) any {
	if r.Text == nil || absent(r.Text.Format) {
		return map[string]any{"format": map[string]string{"type": "text"}}
	}
	return map[string]any{"format": r.Text.Format}
}

func reasoningOf(r *responsesRequest) any {
	if r.Reasoning == nil {
		return map[string]any{"effort": nil, "summary": nil}
	}
	return map[string]any{"effort": r.Reasoning.Effort, "summary": r.Reasoning.Summary}
}

// bufferedWriter keeps a handler's answer in memory.
type bufferedWriter struct {
	header http.Header
	status int
	buf    bytes.Buffer
}

func (b *bufferedWriter) Header() http.Header         { return b.header }
func (b *bufferedWriter) WriteHeader(code int)        { b.status = code }
func (b *bufferedWriter) Write(p []byte) (int, error) { return b.buf.Write(p) }

// responsesStream is the ResponseWriter the chat route streams into: it reads the chat
// chunks it is sent ("data: {json}\n\n") and writes the Responses events they mean to out,
// with sequence numbers, as the chat stream goes.
type responsesStream struct {
	out    *sseWriter
	state  *responseState
	header http.Header
	buf    []byte
	seq    int
	err    error
	// What is open: the message item and its text part, the reasoning item, the calls.
	started, msgOpen, reasoningOpen bool
	items                           int // output items added so far
	msgIndex, reasoningIndex        int
	calls                           []*streamCall
	// pendingLP are logprobs of tokens whose text has not been sent yet: the next text
	// delta carries them.
	pendingLP []chatLogprob
	heldText  string // white space before the message opened (textDelta)
}

type streamCall struct {
	index       int // output index
	id, name    string
	args        strings.Builder
	callID      string
	chatIndex   int
	initialised bool
}

func (s *responsesStream) Header() http.Header { return s.header }
func (s *responsesStream) WriteHeader(int)     {}
func (s *responsesStream) Flush()              {}

func (s *responsesStream) Write(p []byte) (int, error) {
	if s.out.broken {
		return 0, errSSEBroken
	}
	s.buf = append(s.buf, p...)
	for {
		i := bytes.Index(s.buf, []byte("\n\n"))
		if i < 0 {
			break
		}
		ev := s.buf[:i]
		s.buf = s.buf[i+2:]
		data, ok := bytes.CutPrefix(ev, []byte("data: "))
		if !ok {
			continue
		}
		if err := s.chunk(data); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

func (s *responsesStream) emit(typ string, fields map[string]any) error {
	fields["type"] = typ
	fields["sequence_number"] = s.seq
	s.seq++
	return s.out.send(fields)
}

// chunk translates one chat stream chunk.
func (s *responsesStream) chunk(data []byte) error {
	if string(data) == "[DONE]" {
		return nil
	}
	rs := s.state
	if !s.started {
		s.started = true
		if err := s.emit("response.created", map[string]any{"response": rs.object("in_progress")}); err != nil {
			return err
		}
		if err := s.emit("response.in_progress", map[string]any{"response": rs.object("in_progress")}); err != nil {
			return err
		}
	}
	var c struct {
		chatChunk
		Error *errorDetail `json:"error"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return err
	}
	if c.Error != nil {
		// The chat stream failed after it began: the response failed.
		// The response's error code is one of the Responses API's list (openai-python's
		// ResponseError takes no other): the chat error's own code stays on the error event.
		code := "server_error"
		if c.Error.Code != nil && *c.Error.Code == "rate_limit_exceeded" {
			code = *c.Error.Code
		}
		o := rs.object("failed")
		o["status"], o["error"] = "failed", map[string]any{"code": code, "message": c.Error.Message}
		_ = s.emit("error", map[string]any{"code": c.Error.Code, "message": c.Error.Message, "param": c.Error.Param})
		return s.emit("response.failed", map[string]any{"response": o})
	}
	if c.Usage != nil {
		rs.usage = c.Usage
		if err := s.closeAll(); err != nil {
			return err
		}
		// A response cut at max_output_tokens ends with response.completed too, its status
		// incomplete: OpenAI sends response.incomplete there, but the openai SDK's
		// stream.get_final_response() raises without a response.completed, and vLLM sends
		// it whatever the status.
		return s.emit("response.completed", map[string]any{"response": rs.object("completed")})
	}
	for _, ch := range c.Choices {
		d := ch.Delta
		if ch.Logprobs != nil {
			s.pendingLP = append(s.pendingLP, ch.Logprobs.Content...)
			rs.logprobs = append(rs.logprobs, ch.Logprobs.Content...)
		}
		if d.ReasoningContent != nil && *d.ReasoningContent != "" {
			if !s.reasoningOpen {
				s.reasoningOpen, s.reasoningIndex = true, s.items
				s.items++
				item := map[string]any{"type": "reasoning", "id": "rs_" + rs.id[5:], "summary": []any{}, "content": []any{}, "status": "in_progress"}
				if err := s.emit("response.output_item.added", map[string]any{"output_index": s.reasoningIndex, "item": item}); err != nil {
					return err
				}
			}
			rs.reasoning += *d.ReasoningContent
			if err := s.emit("response.reasoning_text.delta", map[string]any{"item_id": "rs_" + rs.id[5:], "output_index": s.reasoningIndex,
				"content_index": 0, "delta": *d.ReasoningContent}); err != nil {
				return err
			}
		}
		if d.Content != nil && *d.Content != "" {
			rs.text += *d.Content
			if err := s.textDelta(*d.Content); err != nil {
				return err
			}
		}
		for _, tc := range d.ToolCalls {
			if err := s.callDelta(tc); err != nil {
				return err
			}
		}
		if ch.FinishReason != nil {
			rs.finish = *ch.FinishReason
		}
	}
	return nil
}

// textDelta streams text of the message, which opens at the first text that is not
// only white space: the blank lines a template puts between the reasoning and a tool
// call (<think>...</think>\n\n<tool_call>) are no message of their own. The held white
// space goes out with the next text, or at the end when the answer has no calls.
func (s *responsesStream) textDelta(text string) error {
	if !s.msgOpen && strings.TrimSpace(text) == "" {
		s.heldText += text
		return nil
	}
	if err := s.openMessage(); err != nil {
		return err
	}
	text, s.heldText = s.heldText+text, ""
	err := s.emit("response.output_text.delta", map[string]any{"item_id": s.state.msgID, "output_index": s.msgIndex,
		"content_index": 0, "delta": text, "logprobs": logprobsOf(s.pendingLP)})
	s.pendingLP = nil
	return err
}

func (s *responsesStream) openMessage() error {
	if s.msgOpen {
		return nil
	}
	rs := s.state
	s.msgOpen, s.msgIndex = true, s.items
	s.items++
	item := rs.message("in_progress")
	item["content"] = []any{}
	if err := s.emit("response.output_item.added", map[string]any{"output_index": s.msgIndex, "item": item}); err != nil {
		return err
	}
	return s.emit("response.content_part.added", map[string]any{"item_id": rs.msgID, "output_index": s.msgIndex,
		"content_index": 0, "part": outputText("", nil)})
}

// callDelta adds a tool call's delta: a new call opens its function_call item, its
// arguments stream as response.function_call_arguments.delta.
func (s *responsesStream) callDelta(tc toolparse.ToolCallDelta) error {
	rs := s.state
	var c *streamCall
	for _, x := range s.calls {
		if x.chatIndex == tc.Index {
			c = x
		}
	}
	if c == nil {
		c = &streamCall{index: s.items, chatIndex: tc.Index}
		s.items++
		s.calls = append(s.calls, c)
	}
	if tc.ID != "" {
		c.callID = tc.ID
	}
	if tc.Function.Name != "" {
		c.name = tc.Function.Name
	}
	if !c.initialised {
		c.initialised = true
		c.id = "fc_" + rs.id[5:] + "_" + strconv.Itoa(len(s.calls)-1)
		item := functionCallItem(rs.id, len(s.calls)-1, c.callID, c.name, "", "in_progress")
		if err := s.emit("response.output_item.added", map[string]any{"output_index": c.index, "item": item}); err != nil {
			return err
		}
	}
	if tc.Function.Arguments != "" {
		c.args.WriteString(tc.Function.Arguments)
		return s.emit("response.function_call_arguments.delta", map[string]any{"item_id": c.id, "output_index": c.index, "delta": tc.Function.Arguments})
	}
	return nil
}

// closeAll ends every open item, in output order, once the answer is complete.
func (s *responsesStream) closeAll() error {
	rs := s.state
	if len(s.calls) == 0 && !s.msgOpen {
		if err := s.openMessage(); err != nil { // an empty answer is still one message
			return err
		}
		if s.heldText != "" {
			if err := s.textDelta(""); err != nil {
				return err
			}
		}
	}
	rs.calls = rs.calls[:0]
	for _, c := range s.calls {
		rs.calls = append(rs.calls, toolparse.ToolCall{ID: c.callID, Type: "function", Function: toolparse.Function{Name: c.name, Arguments: c.args.String()}})
	}
	type closer struct {
		index int
		fn    func() error
	}
	done := "completed" // each item's status; cut at max_output_tokens, incomplete
	if rs.finish == "length" {
		done = "incomplete"
	}
	var cs []closer
	if s.reasoningOpen {
		cs = append(cs, closer{s.reasoningIndex, func() error {
			if err := s.emit("response.reasoning_text.done", map[string]any{"item_id": "rs_" + rs.id[5:], "output_index": s.reasoningIndex, "content_index": 0, "text": rs.reasoning}); err != nil {
				return err
			}
			return s.emit("response.output_item.done", map[string]any{"output_index": s.reasoningIndex, "item": rs.output(done)[0]})
		}})
	}
	if s.msgOpen {
		cs = append(cs, closer{s.msgIndex, func() error {
			if err := s.emit("response.output_text.done", map[string]any{"item_id": rs.msgID, "output_index": s.msgIndex, "content_index": 0, "text": rs.text, "logprobs": logprobsOf(rs.logprobs)}); err != nil {
				return err
			}
			if err := s.emit("response.content_part.done", map[string]any{"item_id": rs.msgID, "output_index": s.msgIndex, "content_index": 0, "part": outputText(rs.text, rs.logprobs)}); err != nil {
				return err
			}
			return s.emit("response.output_item.done", map[string]any{"output_index": s.msgIndex, "item": rs.message(done)})
		}})
	}
	for i, c := range s.calls {
		cs = append(cs, closer{c.index, func() error {
			args := c.args.String()
			if err := s.emit("response.function_call_arguments.done", map[string]any{"item_id": c.id, "output_index": c.index, "arguments": args}); err != nil {
				return err
			}
			return s.emit("response.output_item.done", map[string]any{"output_index": c.index, "item": functionCallItem(rs.id, i, c.callID, c.name, args, done)})
		}})
	}
	for idx := 0; idx < s.items; idx++ {
		for _, c := range cs {
			if c.index == idx {
				if err := c.fn(); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

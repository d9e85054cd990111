package serve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/resin-llm/resin/core/engine"
)

// commonParams are the sampling fields both endpoints share, including vLLM's extensions
// (top_k, min_p, ignore_eos, stop_token_ids, skip_special_tokens).
type commonParams struct {
	Model               string          `json:"model"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	TopK                *int            `json:"top_k"`
	MinP                *float64        `json:"min_p"`
	N                   *int            `json:"n"`
	Stop                json.RawMessage `json:"stop"`
	StopTokenIDs        []int32         `json:"stop_token_ids"`
	Seed                *int64          `json:"seed"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		// IncludeUsage defaults to true once stream_options is sent, as in vLLM.
		IncludeUsage *bool `json:"include_usage"`
		// ContinuousUsageStats puts the usage so far on every chunk (vLLM's).
		ContinuousUsageStats bool `json:"continuous_usage_stats"`
	} `json:"stream_options"`
	IgnoreEOS         bool               `json:"ignore_eos"`
	SkipSpecialTokens *bool              `json:"skip_special_tokens"`
	PresencePenalty   *float64           `json:"presence_penalty"`
	FrequencyPenalty  *float64           `json:"frequency_penalty"`
	LogitBias         map[string]float64 `json:"logit_bias"`
	User              string             `json:"user"`
	// vLLM's extensions.
	RepetitionPenalty      *float64 `json:"repetition_penalty"`
	MinTokens              *int     `json:"min_tokens"`
	IncludeStopStrInOutput bool     `json:"include_stop_str_in_output"`
	// Structured outputs (structured.go): vLLM's guided_* fields and structured_outputs.
	GuidedChoice      json.RawMessage `json:"guided_choice"`
	GuidedJSON        json.RawMessage `json:"guided_json"`
	GuidedRegex       json.RawMessage `json:"guided_regex"`
	GuidedGrammar     json.RawMessage `json:"guided_grammar"`
	StructuredOutputs json.RawMessage `json:"structured_outputs"`
	// vLLM's prompt and logprob extensions.
	AddSpecialTokens       *bool `json:"add_special_tokens"`
	PromptLogprobs         *int  `json:"prompt_logprobs"`
	ReturnTokensAsTokenIDs bool  `json:"return_tokens_as_token_ids"`
	ignoredFields
}

// ignoredFields are what clients send for OpenAI's own bookkeeping (stored completions,
// billing tiers, its prompt cache, abuse tracking): nothing this server outputs depends
// on them, so they are accepted and named in one warning line per request (as vLLM does
// with fields it ignores).
type ignoredFields struct {
	Store            json.RawMessage `json:"store"`
	Metadata         json.RawMessage `json:"metadata"`
	ServiceTier      json.RawMessage `json:"service_tier"`
	PromptCacheKey   json.RawMessage `json:"prompt_cache_key"`
	SafetyIdentifier json.RawMessage `json:"safety_identifier"`
	// prompt_cache_retention asks OpenAI to keep the prompt's cache longer; the prefix
	// cache here keeps blocks as long as the pool has room, whatever it says.
	PromptCacheRetention json.RawMessage `json:"prompt_cache_retention"`
}

// warnIgnored logs, in one line, the fields of r that were accepted and ignored.
func (s *Server) warnIgnored(r *http.Request, names []string) {
	if len(names) > 0 {
		s.log.Warn("request fields accepted and ignored: they do not change what this server answers", "route", r.URL.Path, "fields", names)
	}
}

// sent names the ignored fields a request carries (null counts as absent).
func (f *ignoredFields) sent() []string {
	var names []string
	for _, x := range [...]struct {
		name string
		raw  json.RawMessage
	}{{"store", f.Store}, {"metadata", f.Metadata}, {"service_tier", f.ServiceTier},
		{"prompt_cache_key", f.PromptCacheKey}, {"safety_identifier", f.SafetyIdentifier},
		{"prompt_cache_retention", f.PromptCacheRetention}} {
		if !absent(x.raw) {
			names = append(names, x.name)
		}
	}
	return names
}

// Limits on the fan-out of one request: choices per prompt, candidates per prompt
// (best_of) and engine requests in all (prompts x candidates).
const (
	maxN         = 64
	maxSequences = 256
)

// choices validates n (and best_of, 0 when absent) and returns how many choices each
// prompt answers with and how many candidates are generated for them.
func (p *commonParams) choices(bestOf *int) (n, candidates int, err error) {
	n = 1
	if p.N != nil {
		if *p.N < 1 || *p.N > maxN {
			return 0, 0, invalid("n", "n must be in [1, %d]; got %d.", maxN, *p.N)
		}
		n = *p.N
	}
	candidates = n
	if bestOf != nil {
		if *bestOf < n || *bestOf > maxN {
			return 0, 0, invalid("best_of", "best_of must be in [n, %d] (n = %d); got %d.", maxN, n, *bestOf)
		}
		candidates = *bestOf
	}
	if candidates > n && p.Stream {
		return 0, 0, invalid("best_of", "best_of greater than n is not supported with stream.")
	}
	return n, candidates, nil
}

// absent reports whether an optional JSON field was left out or sent as null.
func absent(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// skipSpecial reports whether special tokens are left out of the text (vLLM's default).
func (p *commonParams) skipSpecial() bool {
	return p.SkipSpecialTokens == nil || *p.SkipSpecialTokens
}

// includeUsage reports whether a stream ends with a usage chunk: when stream_options
// is sent, unless include_usage is false (vLLM's default).
func (p *commonParams) includeUsage() bool {
	o := p.StreamOptions
	return o != nil && (o.IncludeUsage == nil || *o.IncludeUsage)
}

// continuousUsage reports whether every chunk carries the usage so far (vLLM's
// continuous_usage_stats, which needs include_usage).
func (p *commonParams) continuousUsage() bool {
	return p.includeUsage() && p.StreamOptions.ContinuousUsageStats
}

// promptLogprobs validates prompt_logprobs: -1 when absent, else how many alternatives
// each prompt token lists. They are not streamed (vLLM refuses them with stream too).
func (p *commonParams) promptLogprobs() (int, error) {
	if p.PromptLogprobs == nil {
		return -1, nil
	}
	n := *p.PromptLogprobs
	switch {
	case n < 0 || n > engine.MaxTopLogprobs:
		return 0, invalid("prompt_logprobs", "prompt_logprobs must be in [0, %d]; got %d.", engine.MaxTopLogprobs, n)
	case p.Stream:
		return 0, invalid("prompt_logprobs", "prompt_logprobs are not available with stream.")
	}
	return n, nil
}

// completionRequest is the body of POST /v1/completions.
type completionRequest struct {
	commonParams
	Prompt   promptField `json:"prompt"`
	Logprobs *int        `json:"logprobs"`
	Echo     bool        `json:"echo"`
	Suffix   *string     `json:"suffix"`
	BestOf   *int        `json:"best_of"`
}

// chatRequest is the body of POST /v1/chat/completions.
type chatRequest struct {
	commonParams
	Messages           []map[string]json.RawMessage `json:"messages"`
	Logprobs           bool                         `json:"logprobs"`
	TopLogprobs        *int                         `json:"top_logprobs"`
	Tools              []json.RawMessage            `json:"tools"`
	ToolChoice         json.RawMessage              `json:"tool_choice"`
	ResponseFormat     *responseFormat              `json:"response_format"`
	ChatTemplateKwargs map[string]json.RawMessage   `json:"chat_template_kwargs"`
	// ParallelToolCalls false keeps only the first tool call of an answer.
	ParallelToolCalls *bool `json:"parallel_tool_calls"`
	// vLLM's chat extensions: Echo starts the answer with the last message's content
	// when that message has the answer's role; AddGenerationPrompt (default true) and
	// ContinueFinalMessage are the chat template's.
	Echo                 bool  `json:"echo"`
	AddGenerationPrompt  *bool `json:"add_generation_prompt"`
	ContinueFinalMessage bool  `json:"continue_final_message"`
	// ReasoningEffort goes to the chat template (reasoningEffort). The others are
	// accepted only as what this server does anyway (null, text output) and refused
	// otherwise: see refuseOutputs.
	ReasoningEffort json.RawMessage `json:"reasoning_effort"`
	Prediction      json.RawMessage `json:"prediction"`
	Audio           json.RawMessage `json:"audio"`
	Modalities      json.RawMessage `json:"modalities"`
	Functions       json.RawMessage `json:"functions"`
	FunctionCall    json.RawMessage `json:"function_call"`
}

// refuseOutputs refuses, by name, the chat fields whose meaning this server would break
// if it ignored them: a predicted output, audio output, and the legacy function-calling
// fields (whose answer, message.function_call, this server does not write). Their
// null or empty forms, and modalities ["text"], ask for nothing and are accepted.
func (r *chatRequest) refuseOutputs() error {
	switch {
	case !absent(r.Prediction):
		return unsupported("prediction", "prediction (predicted outputs)")
	case !absent(r.Audio):
		return unsupported("audio", "audio output")
	case !emptyList(r.Functions):
		return invalid("functions", "functions is the legacy form of tools, which this server does not support: send tools instead.")
	case !absent(r.FunctionCall):
		return invalid("function_call", "function_call is the legacy form of tool_choice, which this server does not support: send tool_choice instead.")
	}
	if !absent(r.Modalities) {
		var m []string
		if err := json.Unmarshal(r.Modalities, &m); err != nil {
			return invalid("modalities", "modalities must be an array of strings.")
		}
		for _, x := range m {
			if x != "text" {
				return unsupported("modalities", fmt.Sprintf("Output modality %q", x))
			}
		}
	}
	return nil
}

// emptyList reports whether raw is absent, null or [].
func emptyList(raw json.RawMessage) bool {
	return absent(raw) || string(bytes.TrimSpace(raw)) == "[]"
}

// responseFormat is read whole so that a json_schema is refused as response_format
// (only "text" is served), not as an unknown field.
type responseFormat struct {
	Type       string          `json:"type"`
	JSONSchema json.RawMessage `json:"json_schema"`
}

// decodeBody reads one JSON object into v, naming the field on a type error.
func decodeBody(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if ae, ok := errors.AsType[*apiError](err); ok { // from a field's UnmarshalJSON (promptField)
			return ae
		}
		if ae := readError(err); ae != nil {
			return ae
		}
		var mb *http.MaxBytesError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &mb):
			return tooLarge(mb.Limit)
		case errors.As(err, &te):
			// The path runs through the embedded commonParams; clients know the JSON name.
			field := strings.TrimPrefix(te.Field, "commonParams.")
			return typeMismatch(field, te)
		case errors.Is(err, io.EOF):
			return invalid("", "The request body is empty; send a JSON object.")
		}
		// Fields this server does not know are refused, not ignored.
		if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			field, _ := strconv.Unquote(name)
			return invalid(field, "Unknown field %s: this server does not support it.", name)
		}
		return invalid("", "The request body is not valid JSON: %v.", err)
	}
	if dec.More() {
		return invalid("", "The request body holds more than one JSON value.")
	}
	return nil
}

// sampling validates the shared fields and builds the engine's parameters.
func (p *commonParams) sampling(defaultMax int) (engine.SamplingParams, []string, error) {
	var s engine.SamplingParams
	for _, f := range [...]struct {
		name string
		v    *float64
		dst  *float32
	}{{"presence_penalty", p.PresencePenalty, &s.PresencePenalty}, {"frequency_penalty", p.FrequencyPenalty, &s.FrequencyPenalty}} {
		if f.v == nil {
			continue
		}
		if !(*f.v >= -2 && *f.v <= 2) {
			return s, nil, invalid(f.name, "%s must be in [-2, 2]; got %v.", f.name, *f.v)
		}
		*f.dst = float32(*f.v)
	}
	if p.RepetitionPenalty != nil {
		if v := *p.RepetitionPenalty; !(v > 0) || math.IsInf(v, 1) {
			return s, nil, invalid("repetition_penalty", "repetition_penalty must be greater than 0; got %v.", v)
		}
		s.RepetitionPenalty = float32(*p.RepetitionPenalty)
	}
	if len(p.LogitBias) > 0 {
		if len(p.LogitBias) > engine.MaxLogitBias {
			return s, nil, invalid("logit_bias", "logit_bias holds %d entries; at most %d are allowed.", len(p.LogitBias), engine.MaxLogitBias)
		}
		s.LogitBias = make(map[int32]float32, len(p.LogitBias))
		for k, v := range p.LogitBias {
			id, err := strconv.ParseInt(k, 10, 32)
			if err != nil || id < 0 {
				return s, nil, invalid("logit_bias", "logit_bias keys must be token ids; got %q.", k)
			}
			if !(v >= -100 && v <= 100) {
				return s, nil, invalid("logit_bias", "logit_bias values must be in [-100, 100]; got %v for token %d.", v, id)
			}
			s.LogitBias[int32(id)] = float32(v)
		}
	}
	s.Temperature = 1
	if p.Temperature != nil {
		t := *p.Temperature
		if t < 0 || t > 2 || math.IsNaN(t) {
			return s, nil, invalid("temperature", "temperature must be in [0, 2]; got %v.", t)
		}
		s.Temperature = float32(t)
	}
	if p.TopP != nil {
		v := *p.TopP
		if v <= 0 || v > 1 || math.IsNaN(v) {
			return s, nil, invalid("top_p", "top_p must be in (0, 1]; got %v.", v)
		}
		s.TopP = float32(v)
	}
	if p.TopK != nil {
		if *p.TopK < -1 {
			return s, nil, invalid("top_k", "top_k must be -1, 0 (off) or positive; got %d.", *p.TopK)
		}
		s.TopK = max(*p.TopK, 0)
	}
	if p.MinP != nil {
		v := *p.MinP
		if v < 0 || v > 1 || math.IsNaN(v) {
			return s, nil, invalid("min_p", "min_p must be in [0, 1]; got %v.", v)
		}
		s.MinP = float32(v)
	}
	s.MaxTokens = defaultMax
	if p.MaxCompletionTokens != nil {
		if *p.MaxCompletionTokens < 1 {
			return s, nil, invalid("max_completion_tokens", "max_completion_tokens must be at least 1; got %d.", *p.MaxCompletionTokens)
		}
		s.MaxTokens = *p.MaxCompletionTokens
	} else if p.MaxTokens != nil {
		if *p.MaxTokens < 1 {
			return s, nil, invalid("max_tokens", "max_tokens must be at least 1; got %d.", *p.MaxTokens)
		}
		s.MaxTokens = *p.MaxTokens
	}
	if p.MinTokens != nil {
		if *p.MinTokens < 0 || *p.MinTokens > s.MaxTokens && s.MaxTokens > 0 {
			return s, nil, invalid("min_tokens", "min_tokens must be in [0, max_tokens]; got %d.", *p.MinTokens)
		}
		s.MinTokens = *p.MinTokens
	}
	if p.Seed != nil {
		s.Seed, s.HasSeed = uint64(*p.Seed), true
	}
	if len(p.StopTokenIDs) > maxStopTokenIDs {
		return s, nil, invalid("stop_token_ids", "stop_token_ids holds %d ids; at most %d are allowed.", len(p.StopTokenIDs), maxStopTokenIDs)
	}
	s.StopTokenIDs = p.StopTokenIDs
	s.IgnoreEOS = p.IgnoreEOS
	stops, err := parseStop(p.Stop)
	if err != nil {
		return s, nil, err
	}
	return s, stops, nil
}

// checkTokenIDs refuses, naming the field, the token ids of logit_bias and
// stop_token_ids outside the runner's vocabulary. The engine refuses them too, but its
// error cannot say which request field held them.
func (s *Server) checkTokenIDs(sp *engine.SamplingParams) error {
	vocab := s.eng.Info().VocabSize
	for id := range sp.LogitBias {
		if id < 0 || int(id) >= vocab {
			return invalid("logit_bias", "logit_bias token %d is outside the vocabulary [0, %d).", id, vocab)
		}
	}
	for i, id := range sp.StopTokenIDs {
		if id < 0 || int(id) >= vocab {
			return invalid("stop_token_ids", "stop_token_ids[%d] = %d is outside the vocabulary [0, %d).", i, id, vocab)
		}
	}
	return nil
}

const maxStops = 16

// maxStopTokenIDs caps stop_token_ids. Every step of a request that has min_tokens to go
// carries its stop ids to the runner, and the engine checks each generated token against
// them: a body of a million ids made each step's plan megabytes (a runner protocol frame
// over its limit fails every request batched with it) and one request tens of times slower.
const maxStopTokenIDs = 1024

func parseStop(raw json.RawMessage) ([]string, error) {
	if absent(raw) {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		if one == "" {
			return nil, invalid("stop", "stop strings must not be empty.")
		}
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, invalid("stop", "stop must be a string or an array of strings.")
	}
	if len(many) > maxStops {
		return nil, invalid("stop", "At most %d stop strings are allowed; got %d.", maxStops, len(many))
	}
	if slices.Contains(many, "") {
		return nil, invalid("stop", "stop strings must not be empty.")
	}
	return many, nil
}

// templateMessages is chatMessages for the server's chat template: OpenAI's "developer"
// role, which OpenAI's newer clients send in place of "system", becomes "system" unless
// the template names it (as llama.cpp and vLLM map it). A template that does not know the
// role renders it as a turn the model never saw in training, and one that looks for a
// system message first adds its default system prompt beside it.
func (s *Server) templateMessages(in []map[string]json.RawMessage) ([]map[string]any, error) {
	msgs, err := chatMessages(in)
	if err != nil {
		return nil, err
	}
	if !s.developerRole {
		for _, m := range msgs {
			if m["role"] == "developer" {
				m["role"] = "system"
			}
		}
	}
	return msgs, nil
}

// chatMessages converts OpenAI messages into the maps chat templates read: content
// becomes a string (text parts joined), other fields pass through as decoded JSON.
func chatMessages(in []map[string]json.RawMessage) ([]map[string]any, error) {
	if len(in) == 0 {
		return nil, invalid("messages", "messages must hold at least one message.")
	}
	out := make([]map[string]any, len(in))
	for i, m := range in {
		msg := make(map[string]any, len(m))
		for k, v := range m {
			if k == "content" {
				continue
			}
			if !json.Valid(v) {
				return nil, invalid(fmt.Sprintf("messages[%d].%s", i, k), "Invalid JSON in messages[%d].%s.", i, k)
			}
			msg[k] = v // raw JSON keeps its key order for the template's tojson
		}
		var role string
		if raw, ok := m["role"]; ok {
			if err := json.Unmarshal(raw, &role); err != nil {
				return nil, invalid(fmt.Sprintf("messages[%d].role", i), "messages[%d].role must be a string.", i)
			}
		}
		msg["role"] = role
		switch role {
		case "system", "developer", "user", "assistant", "tool":
		case "":
			return nil, invalid(fmt.Sprintf("messages[%d].role", i), "messages[%d] has no role.", i)
		default:
			return nil, invalid(fmt.Sprintf("messages[%d].role", i), "messages[%d] has unknown role %q.", i, role)
		}
		content, err := messageContent(m["content"], i)
		if err != nil {
			return nil, err
		}
		msg["content"] = content
		out[i] = msg
	}
	return out, nil
}

func messageContent(raw json.RawMessage, i int) (any, error) {
	if absent(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, invalid(fmt.Sprintf("messages[%d].content", i), "messages[%d].content must be a string or an array of content parts.", i)
	}
	var b strings.Builder
	for j, p := range parts {
		if p.Type != "text" {
			return nil, invalid(fmt.Sprintf("messages[%d].content[%d].type", i, j), "Content part type %q is not supported (text only).", p.Type)
		}
		if j > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

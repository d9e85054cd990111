package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"weak"

	"github.com/resin-llm/resin/core/grammar"
	"github.com/resin-llm/resin/core/serve/toolparse"
)

// Structured outputs: every way a client asks for constrained output becomes one grammar
// (core/grammar), compiled once per (kind, text) against the tokenizer's vocabulary and
// applied by the engine to each generation's sampling through a matcher of its own:
//
//	response_format        {"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}}
//	tool_choice            "required" (one or more calls of the offered tools) or
//	                       {"type": "function", "function": {"name": ...}} (that tool's arguments)
//	guided_json            a JSON Schema (an object, or a string holding one)
//	guided_regex           a regular expression the whole answer matches
//	guided_grammar         a GBNF grammar (llama.cpp's syntax)
//	guided_choice          one of the given strings
//	structured_outputs     vLLM's newer form: {"json" | "regex" | "choice" | "grammar" | "json_object"}
//
// As in vLLM, a forced tool call is generated as JSON and returned as tool_calls: the
// arguments object of the named tool, or for "required" an array of {"name",
// "parameters"} objects, one per call; with the hermes or llama3_json tool-call parser
// it is generated in the model's own format instead, which the parser reads. A schema or
// feature the grammar compiler cannot enforce is refused with a 400 naming it, before
// anything is generated.

// structured is the constraint a request asked for.
type structured struct {
	field  string // the request field it came from, for errors
	kind   grammar.Kind
	source string
	// forced is set for tool_choice required or named: the answer is turned into tool
	// calls.
	forced *forcedTools
}

// forcedTools says how a forced tool call's JSON answer becomes tool calls.
type forcedTools struct {
	name  string // the named function; "" for tool_choice "required"
	tools []json.RawMessage
	one   bool // parallel_tool_calls false: exactly one call
}

// nativeFormats are the tool-call formats a forced call is written in: before the
// function's name (a JSON string), between it and the arguments, after them, and between
// calls. (The formats whose markers are special tokens, which a grammar never allows, are
// left to vLLM's JSON form.)
var nativeFormats = map[string]struct{ before, between, end, separator string }{
	"hermes":      {"<tool_call>\n{\"name\": ", ", \"arguments\": ", "}\n</tool_call>", "\n"},
	"llama3_json": {"{\"name\": ", ", \"parameters\": ", "}", "; "},
}

// nativeFormat rewrites a forced tool call into the server's tool-call format when the
// model has one the grammar can write (nativeFormats): the model then calls
// the tool as it was trained to, and the tool-call parser reads the calls. Otherwise c
// stays vLLM's JSON form.
func (c *structured) nativeFormat(format string) (*structured, error) {
	nf, ok := nativeFormats[format]
	if c == nil || c.forced == nil || !ok {
		return c, nil
	}
	defs, err := toolDefs(c.forced.tools)
	if err != nil {
		return nil, err
	}
	type structure struct {
		Begin  string          `json:"begin"`
		Schema json.RawMessage `json:"schema"`
		End    string          `json:"end"`
	}
	var src struct {
		Structures []structure `json:"structures"`
		Separator  string      `json:"separator"`
		Min        int         `json:"min"`
		Max        int         `json:"max"`
	}
	src.Separator, src.Min = nf.separator, 1
	if c.forced.name != "" || c.forced.one {
		src.Max = 1
	}
	for _, d := range defs {
		if c.forced.name != "" && d.Function.Name != c.forced.name {
			continue
		}
		name, _ := json.Marshal(d.Function.Name)
		src.Structures = append(src.Structures, structure{
			Begin:  nf.before + string(name) + nf.between,
			Schema: json.RawMessage(d.parameters()), End: nf.end})
	}
	b, err := json.Marshal(src)
	if err != nil {
		return nil, invalid(c.field, "tools: %v", err)
	}
	return &structured{field: c.field, kind: grammar.Tagged, source: string(b)}, nil
}

// maxGrammars is how many compiled grammars a server keeps.
const maxGrammars = 64

// grammarCaches holds each Server's grammar cache, built on first use (the vocabulary's
// token trie takes a while on a large vocabulary). It is keyed by a weak pointer and the
// entry is deleted when its Server is collected, so that a process that builds servers
// one after another (reloads, tests) does not keep every vocabulary and its grammars.
var grammarCaches sync.Map // weak.Pointer[Server] -> *grammarCache

type grammarCache struct {
	once  sync.Once
	cache *grammar.Cache
	err   error
}

func (s *Server) grammars() (*grammar.Cache, error) {
	key := weak.Make(s)
	v, loaded := grammarCaches.LoadOrStore(key, &grammarCache{})
	if !loaded {
		runtime.AddCleanup(s, func(k weak.Pointer[Server]) { grammarCaches.Delete(k) }, key)
	}
	gc := v.(*grammarCache)
	gc.once.Do(func() {
		info := s.eng.Info()
		voc, err := grammar.FromTokenizer(s.tok, info.EOS, info.VocabSize)
		if err != nil {
			gc.err = err
			return
		}
		gc.cache = grammar.NewCache(voc, maxGrammars)
	})
	return gc.cache, gc.err
}

// compile returns the grammar of c, or a 400 naming c's field.
func (s *Server) compile(c *structured) (*grammar.Grammar, error) {
	if c == nil {
		return nil, nil
	}
	if !s.eng.Info().TokenMasks {
		return nil, unsupported(c.field, c.field+" (structured output) with this runner, whose sampler does not apply token masks,")
	}
	cache, err := s.grammars()
	if err != nil {
		return nil, internal(fmt.Errorf("structured output: %w", err))
	}
	g, err := cache.Get(c.kind, c.source)
	if err != nil {
		return nil, invalid(c.field, "%s cannot be enforced: %v.", c.field, err)
	}
	return g, nil
}

// pick keeps the one structured-output request of a body, refusing two.
func pick(cur *structured, next *structured) (*structured, error) {
	if next == nil {
		return cur, nil
	}
	if cur != nil {
		return nil, invalid(next.field, "%s and %s both constrain the output; send one.", cur.field, next.field)
	}
	return next, nil
}

// guidedStructured reads the vLLM fields both endpoints share: guided_json, guided_regex,
// guided_grammar and structured_outputs. (guided_choice is read by the caller, which
// falls back to scoring the choices on a runner without token masks.)
func (p *commonParams) guidedStructured() (*structured, error) {
	var out *structured
	var err error
	if !absent(p.GuidedJSON) {
		src, e := schemaText(p.GuidedJSON, "guided_json")
		if e != nil {
			return nil, e
		}
		out = &structured{field: "guided_json", kind: grammar.JSONSchema, source: src}
	}
	for _, f := range [...]struct {
		name string
		raw  json.RawMessage
		kind grammar.Kind
	}{{"guided_regex", p.GuidedRegex, grammar.Regex}, {"guided_grammar", p.GuidedGrammar, grammar.GBNF}} {
		if absent(f.raw) {
			continue
		}
		var text string
		if json.Unmarshal(f.raw, &text) != nil || text == "" {
			return nil, invalid(f.name, "%s must be a non-empty string.", f.name)
		}
		if out, err = pick(out, &structured{field: f.name, kind: f.kind, source: text}); err != nil {
			return nil, err
		}
	}
	if !absent(p.StructuredOutputs) {
		so, err := parseStructuredOutputs(p.StructuredOutputs)
		if err != nil {
			return nil, err
		}
		if out, err = pick(out, so); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// schemaText returns a JSON Schema sent as an object, or as a string holding one.
func schemaText(raw json.RawMessage, field string) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", invalid(field, "%s must be a JSON Schema (an object, or a string holding one).", field)
		}
		raw = []byte(strings.TrimSpace(s))
	}
	if len(raw) == 0 || raw[0] != '{' && string(raw) != "true" {
		return "", invalid(field, "%s must be a JSON Schema (an object, or a string holding one).", field)
	}
	return string(raw), nil
}

// parseStructuredOutputs reads vLLM's structured_outputs: exactly one of json, regex,
// choice, grammar, json_object; the options vLLM's backends read are accepted when they
// ask for this compiler's behaviour and refused otherwise.
func parseStructuredOutputs(raw json.RawMessage) (*structured, error) {
	var so struct {
		JSON                        json.RawMessage `json:"json"`
		Regex                       *string         `json:"regex"`
		Choice                      []string        `json:"choice"`
		Grammar                     *string         `json:"grammar"`
		JSONObject                  *bool           `json:"json_object"`
		StructuralTag               json.RawMessage `json:"structural_tag"`
		DisableFallback             *bool           `json:"disable_fallback"`
		DisableAnyWhitespace        *bool           `json:"disable_any_whitespace"`
		DisableAdditionalProperties *bool           `json:"disable_additional_properties"`
		WhitespacePattern           *string         `json:"whitespace_pattern"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&so); err != nil {
		return nil, invalid("structured_outputs", "structured_outputs: %v.", err)
	}
	switch {
	case !absent(so.StructuralTag):
		return nil, unsupported("structured_outputs", "structured_outputs.structural_tag")
	case so.WhitespacePattern != nil:
		return nil, unsupported("structured_outputs", "structured_outputs.whitespace_pattern")
	case so.DisableAnyWhitespace != nil && *so.DisableAnyWhitespace:
		return nil, unsupported("structured_outputs", "structured_outputs.disable_any_whitespace")
	}
	var out *structured
	var err error
	const f = "structured_outputs"
	if !absent(so.JSON) {
		src, e := schemaText(so.JSON, "structured_outputs.json")
		if e != nil {
			return nil, e
		}
		out = &structured{field: f, kind: grammar.JSONSchema, source: src}
	}
	if so.Regex != nil {
		if out, err = pick(out, &structured{field: f + ".regex", kind: grammar.Regex, source: *so.Regex}); err != nil {
			return nil, err
		}
	}
	if so.Grammar != nil {
		if out, err = pick(out, &structured{field: f + ".grammar", kind: grammar.GBNF, source: *so.Grammar}); err != nil {
			return nil, err
		}
	}
	if so.Choice != nil {
		src, _ := json.Marshal(so.Choice)
		if out, err = pick(out, &structured{field: f + ".choice", kind: grammar.Choice, source: string(src)}); err != nil {
			return nil, err
		}
	}
	if so.JSONObject != nil && *so.JSONObject {
		if out, err = pick(out, &structured{field: f + ".json_object", kind: grammar.JSONObject}); err != nil {
			return nil, err
		}
	}
	if out == nil {
		return nil, invalid(f, "structured_outputs names no constraint: send one of json, regex, choice, grammar, json_object.")
	}
	return out, nil
}

// chatStructured reads a chat request's response_format and tool_choice.
func (r *chatRequest) chatStructured() (*structured, error) {
	var out *structured
	if rf := r.ResponseFormat; rf != nil {
		switch rf.Type {
		case "", "text":
		case "json_object":
			out = &structured{field: "response_format", kind: grammar.JSONObject}
		case "json_schema":
			var js struct {
				Name        string          `json:"name"`
				Description string          `json:"description"`
				Schema      json.RawMessage `json:"schema"`
				Strict      *bool           `json:"strict"`
			}
			if absent(rf.JSONSchema) || json.Unmarshal(rf.JSONSchema, &js) != nil {
				return nil, invalid("response_format", "response_format json_schema needs a json_schema object with a schema.")
			}
			if absent(js.Schema) {
				return nil, invalid("response_format", "response_format json_schema needs json_schema.schema.")
			}
			src, err := schemaText(js.Schema, "response_format")
			if err != nil {
				return nil, err
			}
			out = &structured{field: "response_format", kind: grammar.JSONSchema, source: src}
		default:
			return nil, unsupported("response_format", "response_format "+rf.Type)
		}
	}
	tc := bytes.TrimSpace(r.ToolChoice)
	switch s := string(tc); {
	case s == "" || s == "null" || s == `"none"` || s == `"auto"`:
		return out, nil
	case s == `"required"`:
		if len(r.Tools) == 0 {
			return nil, invalid("tool_choice", `tool_choice "required" needs tools.`)
		}
		one := r.ParallelToolCalls != nil && !*r.ParallelToolCalls
		schema, err := requiredToolsSchema(r.Tools, one)
		if err != nil {
			return nil, err
		}
		return pick(out, &structured{field: "tool_choice", kind: grammar.JSONSchema, source: schema, forced: &forcedTools{tools: r.Tools, one: one}})
	}
	var named struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(tc, &named) != nil || named.Type != "function" || named.Function.Name == "" {
		return nil, invalid("tool_choice", `tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}.`)
	}
	params, ok, err := toolParameters(r.Tools, named.Function.Name)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, invalid("tool_choice", "tool_choice names the function %q, which tools does not offer.", named.Function.Name)
	}
	return pick(out, &structured{field: "tool_choice", kind: grammar.JSONSchema, source: params, forced: &forcedTools{name: named.Function.Name, tools: r.Tools}})
}

type toolDef struct {
	Type     string `json:"type"`
	Function struct {
		Name       string          `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	} `json:"function"`
}

// parameters is a tool's parameter schema; any object when it has none.
func (t *toolDef) parameters() string {
	if absent(t.Function.Parameters) {
		return `{"type": "object"}`
	}
	return string(t.Function.Parameters)
}

// toolDefs reads the tools of a request: each a function tool (type "function", or no
// type, vLLM's default) with a name and, when it has parameters, a schema object. What
// else a request sends as a tool is refused naming it: the chat template would render a
// tool without a name or with a string for its schema as nonsense the model is prompted
// with, and a "custom" tool (free-form input) is one no tool-call parser here returns.
func toolDefs(tools []json.RawMessage) ([]toolDef, error) {
	defs := make([]toolDef, len(tools))
	for i, raw := range tools {
		d := &defs[i]
		if err := json.Unmarshal(raw, d); err != nil {
			return nil, invalid(fmt.Sprintf("tools[%d]", i), "tools[%d] is not a function tool: %v.", i, err)
		}
		switch {
		case d.Type != "" && d.Type != "function":
			return nil, invalid(fmt.Sprintf("tools[%d].type", i), "tools[%d] has type %q; only function tools are supported.", i, d.Type)
		case d.Function.Name == "":
			return nil, invalid(fmt.Sprintf("tools[%d].function.name", i), "tools[%d] has no function name.", i)
		case !absent(d.Function.Parameters) && !isObject(d.Function.Parameters):
			return nil, invalid(fmt.Sprintf("tools[%d].function.parameters", i), "tools[%d].function.parameters must be a JSON Schema object.", i)
		}
	}
	return defs, nil
}

// isObject reports whether raw is a JSON object.
func isObject(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '{'
}

func toolParameters(tools []json.RawMessage, name string) (string, bool, error) {
	defs, err := toolDefs(tools)
	if err != nil {
		return "", false, err
	}
	for _, d := range defs {
		if d.Function.Name == name {
			return d.parameters(), true, nil
		}
	}
	return "", false, nil
}

// requiredToolsSchema is vLLM's schema for tool_choice "required": a non-empty array of
// calls, each {"name": one of the tools, "parameters": that tool's arguments}; one call
// only when one (parallel_tool_calls false), so that no tokens go to calls dropped later.
// The tools' schema definitions ($defs, and draft-07's definitions) move to its root, as
// vLLM does, where their "#/$defs/..." references (pydantic's nested models) resolve.
func requiredToolsSchema(tools []json.RawMessage, one bool) (string, error) {
	defs, err := toolDefs(tools)
	if err != nil {
		return "", err
	}
	hoisted := map[string]map[string]json.RawMessage{}
	var b strings.Builder
	b.WriteString(`{"type": "array", "minItems": 1, `)
	if one {
		b.WriteString(`"maxItems": 1, `)
	}
	b.WriteString(`"items": {"anyOf": [`)
	for i, d := range defs {
		if i > 0 {
			b.WriteString(", ")
		}
		params, err := hoistDefinitions(d.parameters(), i, hoisted)
		if err != nil {
			return "", err
		}
		name, _ := json.Marshal(d.Function.Name)
		fmt.Fprintf(&b, `{"type": "object", "properties": {"name": {"const": %s}, "parameters": %s}, "required": ["name", "parameters"], "additionalProperties": false}`, name, params)
	}
	b.WriteString(`]}`)
	for _, key := range definitionKeys {
		if len(hoisted[key]) > 0 {
			raw, err := json.Marshal(hoisted[key])
			if err != nil {
				return "", invalid("tools", "tools: %s: %v", key, err)
			}
			fmt.Fprintf(&b, `, %q: %s`, key, raw)
		}
	}
	b.WriteString(`}`)
	return b.String(), nil
}

// definitionKeys are the keywords under which a JSON Schema keeps definitions that
// references point into.
var definitionKeys = []string{"$defs", "definitions"}

// hoistDefinitions takes tool i's definitions out of its parameter schema into into
// (keyword -> name -> schema) and returns the schema without them. A name two tools
// define differently is refused: one root cannot hold both.
func hoistDefinitions(params string, i int, into map[string]map[string]json.RawMessage) (string, error) {
	var top map[string]json.RawMessage
	if json.Unmarshal([]byte(params), &top) != nil {
		return params, nil // not an object: nothing to hoist (the compiler judges it)
	}
	moved := false
	for _, key := range definitionKeys {
		raw, ok := top[key]
		if !ok {
			continue
		}
		var named map[string]json.RawMessage
		if err := json.Unmarshal(raw, &named); err != nil {
			return "", invalid("tools", "tools[%d].function.parameters.%s must be an object of schemas.", i, key)
		}
		if into[key] == nil {
			into[key] = map[string]json.RawMessage{}
		}
		for name, schema := range named {
			var compact bytes.Buffer
			if err := json.Compact(&compact, schema); err != nil {
				return "", invalid("tools", "tools[%d].function.parameters.%s.%s: %v", i, key, name, err)
			}
			if prev, ok := into[key][name]; ok && !bytes.Equal(prev, compact.Bytes()) {
				return "", invalid("tools", `tools[%d].function.parameters.%s defines %q differently from an earlier tool: tool_choice "required" needs one definition per name.`, i, key, name)
			}
			into[key][name] = compact.Bytes()
		}
		delete(top, key)
		moved = true
	}
	if !moved {
		return params, nil
	}
	out, err := json.Marshal(top)
	if err != nil {
		return "", invalid("tools", "tools[%d].function.parameters: %v", i, err)
	}
	return string(out), nil
}

// toolCalls turns a forced tool call's generated JSON into tool calls; ok is false when the
// text is not complete (the generation hit max_tokens), in which case it stays content.
func (f *forcedTools) toolCalls(text string) ([]toolparse.ToolCall, bool) {
	call := func(name, args string) toolparse.ToolCall {
		return toolparse.ToolCall{ID: newID("chatcmpl-tool-"), Type: "function", Function: toolparse.Function{Name: name, Arguments: args}}
	}
	if f.name != "" {
		if !json.Valid([]byte(text)) {
			return nil, false
		}
		return []toolparse.ToolCall{call(f.name, strings.TrimSpace(text))}, true
	}
	var calls []struct {
		Name       string          `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	}
	if err := json.Unmarshal([]byte(text), &calls); err != nil || len(calls) == 0 {
		return nil, false
	}
	out := make([]toolparse.ToolCall, len(calls))
	for i, c := range calls {
		var compact bytes.Buffer
		if json.Compact(&compact, c.Parameters) != nil {
			return nil, false
		}
		out[i] = call(c.Name, compact.String())
	}
	return out, true
}

// finish is the finish reason of a forced call: "stop" for a named function (as OpenAI
// answers), "tool_calls" for "required".
func (f *forcedTools) finish() string {
	if f.name != "" {
		return "stop"
	}
	return "tool_calls"
}

// guidedRequest reads the vLLM structured-output fields into *con (refusing a second
// constraint beside the one already there). guided_choice becomes a choice grammar when
// the runner applies token masks; otherwise its strings are returned, for the scoring
// path of guided.go.
func (s *Server) guidedRequest(p *commonParams, con **structured) ([]string, error) {
	so, err := p.guidedStructured()
	if err != nil {
		return nil, err
	}
	if *con, err = pick(*con, so); err != nil {
		return nil, err
	}
	choices, err := parseGuidedChoice(p.GuidedChoice)
	if err != nil || choices == nil {
		return nil, err
	}
	if !s.eng.Info().TokenMasks {
		if *con != nil {
			return nil, invalid("guided_choice", "guided_choice and %s both constrain the output; send one.", (*con).field)
		}
		return choices, nil
	}
	src, _ := json.Marshal(choices)
	*con, err = pick(*con, &structured{field: "guided_choice", kind: grammar.Choice, source: string(src)})
	return nil, err
}

// streamForced streams a forced tool call: the role chunk, logprobs as they come, then the
// calls in one delta once the JSON is complete (or the text as content when it is not),
// and the finish chunk.
func (s *Server) streamForced(ctx context.Context, c *choiceGen, cs *choiceStream, out chatOutput,
	chunk func(int, chatDelta, *chatLogprobs, *string, int) chatChunk) error {
	index := c.candidate
	empty := ""
	if err := cs.send(chunk(index, chatDelta{Role: out.role, Content: &empty}, nil, nil, 0)); err != nil {
		return err
	}
	var text strings.Builder
	generated := 0
	res, err := s.produce(ctx, c, func(d delta) error {
		generated += len(d.tokens)
		text.WriteString(d.text)
		if out.logprobs && len(d.logprobs) > 0 {
			return cs.send(chunk(index, chatDelta{}, s.chatLogprobs(d.logprobs, out.view), nil, generated))
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.res = res
	finish := res.finish
	if calls, ok := out.forced.toolCalls(text.String()); ok {
		if out.oneToolCall {
			calls = calls[:1]
		}
		deltas := make([]toolparse.ToolCallDelta, len(calls))
		for i, call := range calls {
			deltas[i] = toolparse.ToolCallDelta{Index: i, ID: call.ID, Type: "function",
				Function: toolparse.FunctionDelta{Name: call.Function.Name, Arguments: call.Function.Arguments}}
		}
		if err := cs.send(chunk(index, chatDelta{ToolCalls: deltas}, nil, nil, generated)); err != nil {
			return err
		}
		finish = out.forced.finish()
	} else if t := text.String(); t != "" {
		if err := cs.send(chunk(index, chatDelta{Content: &t}, nil, nil, generated)); err != nil {
			return err
		}
	}
	return cs.send(chunk(index, chatDelta{}, nil, &finish, res.usage.CompletionTokens))
}

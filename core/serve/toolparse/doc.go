// Package toolparse reads tool calls and reasoning out of generated text, as vLLM's
// --tool-call-parser and --reasoning-parser do, for the OpenAI chat API's tool_calls and
// reasoning_content.
//
// A Parser is chosen by name (ToolParsers and ReasoningParsers list them):
//
//	p, err := toolparse.New("hermes", "qwen3")
//	res := p.Parse(prompt, text, tools)     // whole generation
//	s := p.NewStream(prompt, tools)         // or delta by delta:
//	d := s.Add(delta)                       // d.Content, d.Reasoning, d.ToolCalls
//	d = s.Flush()                           // at the end of the generation
//
// Streaming never emits partial markup (a "<tool_c" held back until it is known not to
// open a call), and a stream fed any split of a text gives the same result as Parse,
// which is the stream fed the whole text at once. Tool-call arguments are the JSON text
// of the arguments as the model wrote it, so the arguments streamed piece by piece join
// to the final string (vLLM's hermes and llama3_json re-serialize them with json.dumps;
// its DeepSeek parsers keep the text, as here). Nothing announced is taken back: a call
// whose name was read stays even if its JSON then breaks, and the first "name" and
// "arguments" of an object count. FuzzStreamSplit checks the independence from splits
// on arbitrary text.
//
// Formats:
//   - hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Hermes, Qwen2.5,
//     Qwen3); content is the text before the first call.
//   - llama3_json: {"name": ..., "parameters": {...}} as the whole output, optionally after
//     <|python_tag|>, several separated by ';' (Llama 3.1-3.3).
//   - deepseek_v3: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
//     ```json ARGS ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜> (DeepSeek-V3, R1).
//   - deepseek_v31: <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜> inside the
//     same calls block (DeepSeek-V3.1).
//   - deepseek_v4: DSML, <｜DSML｜tool_calls><｜DSML｜invoke name="NAME"><｜DSML｜parameter
//     name="K" string="true|false">V</｜DSML｜parameter>...</｜DSML｜invoke>... (DeepSeek-V4,
//     the reference model in models/deepseek-v4-flash); arguments built as a JSON object.
//   - mistral: [TOOL_CALLS]NAME[ARGS]{...} (tokenizer v11 on: Mistral Small 3.2, Ministral
//     3) or [TOOL_CALLS] [{"name": ..., "arguments": {...}}] (earlier); [TOOL_CALLS] is a
//     special token, kept in the text for this parser (KeepsSpecialTokens).
//   - qwen3_coder: <tool_call><function=NAME><parameter=K>V</parameter>...</function>
//     </tool_call> (Qwen3-Coder, Qwen3.5, Qwen3.6); values converted by the types of the
//     request's tool definitions, as vLLM's qwen3_coder.
//
// Reasoning: qwen3, deepseek_v4 (the same rule) and deepseek_r1 read <think>...</think>. deepseek_r1 treats the output
// as reasoning until </think> (its template opens <think> in the prompt); qwen3 does so
// when the output starts with <think> or the prompt ends inside an open <think>, and
// otherwise reads the output as content.
package toolparse

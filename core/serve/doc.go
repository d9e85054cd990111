// Package serve is Resin's optional HTTP service: an OpenAI-compatible API in front of an
// engine.Engine and a tokenizer.
//
// Endpoints: POST /v1/completions and /v1/chat/completions (JSON or Server-Sent Events
// streaming, usage, finish_reason, logprobs, stop strings and token ids, seed,
// max_tokens / max_completion_tokens, token-id prompts), POST /v1/responses (OpenAI's
// Responses API without a response store, translated to and from a chat completion:
// responses.go), GET /v1/models; vLLM's POST
// /tokenize and /detokenize and GET /tokenizer_info and /version; /health and /metrics
// (the engine's Prometheus registry: resin_ metrics, the same under vLLM's vllm: names
// for vLLM's dashboards, all labelled with model_name, process and Go metrics);
// /debug/pprof/ when Config.EnablePprof is set. Errors use OpenAI's error JSON with the
// status a client expects: 400 invalid, 401 bad key (with WWW-Authenticate), 404
// unknown model or path, 405 a known path with the wrong method (with an Allow header),
// 408 body too slow, 413 body too large, 415 a body that is not JSON, 429 queue full or
// tokenizer busy (with Retry-After), 503 draining. Browsers' cross-origin calls are
// answered as vLLM answers them (cors.go: any origin by default, Config.AllowedOrigins to
// narrow or turn that off; a preflight from an origin not allowed gets 403).
//
// Request fields are OpenAI's and vLLM's extensions (top_k, min_p, repetition_penalty,
// min_tokens, ignore_eos, stop_token_ids, echo and prompt_logprobs,
// add_generation_prompt, continue_final_message, add_special_tokens,
// return_tokens_as_token_ids, stream_options.continuous_usage_stats), and structured
// outputs (structured.go: response_format json_object and json_schema, tool_choice
// "required" and a named function, guided_json, guided_regex, guided_grammar,
// guided_choice, structured_outputs), enforced by grammar-constrained decoding on a
// runner that applies token masks. reasoning_effort reaches the chat template as vLLM
// passes it (reasoning_effort and enable_thinking). Fields that change nothing this
// server answers (store, metadata, service_tier, prompt_cache_key, safety_identifier)
// are accepted and named in a warning; fields it does not serve (a
// prediction, audio, the legacy functions, a schema feature the grammar compiler cannot
// enforce) and unknown ones are refused with 400 naming them.
//
// What one client can hold is bounded: reading a request (Config.ReadTimeout,
// ReadHeaderTimeout, MaxHeaderBytes, MaxBodyBytes), an idle connection (IdleTimeout),
// the connections open at once (MaxConnections: at the cap a new connection takes the
// place of the one idle longest, or gets 503 when all are busy), and the prompt bytes
// being tokenized (a prompt is refused by its size unread, then counted a chunk at a
// time, and the bytes tokenized at once stay within TokenizeBudgetBytes). The API key,
// draining, content type and declared size are checked before a byte of the body is
// read.
//
// A client that disconnects aborts its request in the engine (the request's context is
// the HTTP request's), and so does one that stops reading: each write to a client has
// its own deadline (Config.WriteStallTimeout), and a write that misses it ends the
// request as a disconnect does. Server.Serve drains on shutdown: /health and new
// requests get 503 on any connection, new or kept alive, while the running ones finish,
// then the listener closes; streams still running at the drain deadline are aborted and
// end with an error event.
//
// A runner that fails for good (engine.Engine.Err: a dead rank of a tensor/expert-parallel
// group) shuts the server down as vLLM's engine-dead path does: from then on /health
// answers 503 {"status":"unhealthy","error":...} naming the cause and new requests 503
// (code runner_dead), the running requests drain, and Serve returns an error naming the
// cause, so `resin serve` exits non-zero for its orchestrator to restart it.
package serve

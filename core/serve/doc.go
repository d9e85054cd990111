// Package serve is Resin's optional HTTP service: an OpenAI-compatible API in front of an
// engine.Engine and a tokenizer.
//
// Endpoints: POST /v1/completions and /v1/chat/completions (JSON or Server-Sent Events
// streaming, usage, finish_reason, logprobs, stop strings and token ids, seed,
// max_tokens / max_completion_tokens, token-id prompts), GET /v1/models, /health and
// /metrics (the engine's Prometheus registry). Errors use OpenAI's error JSON with the
// status a client expects: 400 invalid, 401 bad key, 404 unknown model or path, 405 a
// known path with the wrong method (with an Allow header), 413 body too large, 429 queue
// full, 503 draining.
//
// A client that disconnects aborts its request in the engine (the request's context is
// the HTTP request's), and so does one that stops reading: each write to a client has
// its own deadline (Config.WriteStallTimeout), and a write that misses it ends the
// request as a disconnect does. Server.Serve drains on shutdown: new requests get 503
// while the running ones finish, up to a deadline after which they are aborted.
package serve

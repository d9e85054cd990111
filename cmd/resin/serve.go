package main

import (
	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/cli"
)

func newServeCmd() *cobra.Command {
	cmd := cli.ServeCmd(&runtimeFlags{})
	cmd.Short = "Serve a runtime over an OpenAI-compatible HTTP API"
	cmd.Long = `Runs the engine with a runner and a tokenizer behind /v1/completions,
/v1/chat/completions, /v1/models, /health and /metrics. --model NAME runs a registered
model (models/registry.go; 'auto' picks it by config.json's architectures) on the
checkpoint in --weights DIR, or on seeded random weights of --random-weights CONFIG.
Without --model the runner is the engine's deterministic test runner. The tokenizer is
--tokenizer DIR, else the one in --weights, else the built-in tiny one.
--tool-call-parser (hermes, qwen3_coder, llama3_json, mistral, deepseek_v3, deepseek_v31,
deepseek_v4) and --reasoning-parser (qwen3, deepseek_r1, deepseek_v4) fill chat
responses' tool_calls and reasoning_content, as vLLM's do.
--read-timeout, --idle-timeout, --max-connections, --max-body-bytes and
--tokenize-budget-bytes bound what one client can hold; /tokenize, /detokenize,
/tokenizer_info and /version are served as vLLM serves them, and --enable-pprof adds Go
profiles under /debug/pprof/. Browser pages of any origin may call the API, as vLLM's
--allowed-origins '*' lets them; --allowed-origins narrows that to a list ("" for none).

` + cli.ServeConnectionsHelp
	return cmd
}

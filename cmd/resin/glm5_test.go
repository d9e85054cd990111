package main

import (
	"io"
	"testing"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/serve"
)

// TestServeGLM5RandomWeights checks that `resin serve --model glm-5-flash --random-weights
// models/glm-5-flash/config.json` (with drafts) starts with no tokenizer given: the model's
// demo config must hold the built-in tiny tokenizer's vocabulary, or serve refuses it.
func TestServeGLM5RandomWeights(t *testing.T) {
	var f runtimeFlags
	cmd := &cobra.Command{Use: "serve"}
	f.Register(cmd)
	if err := cmd.Flags().Parse([]string{"--model", "glm-5-flash", "--random-weights", "../../models/glm-5-flash/config.json", "--num-speculative-tokens", "2"}); err != nil {
		t.Fatal(err)
	}
	rt, err := f.Load(io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(rt.Runner, engine.Config{Pool: rt.Pool})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := serve.New(serve.Config{Engine: e, Tokenizer: rt.Tokenizer, ChatTemplate: rt.Chat, Model: "glm-5-flash"}); err != nil {
		t.Fatal(err)
	}
}

package serve

import (
	"context"
	"fmt"

	"github.com/resin-llm/resin/core/tokenizer"
)

// GenerateParams is one prompt run outside HTTP, as `resin generate` does.
type GenerateParams struct {
	// Prompt is the text; with Chat it is the user message of a one-turn conversation
	// rendered with the chat template.
	Prompt string
	Chat   bool
	System string
	// MaxTokens caps the output (0 = up to the context). Temperature 0 is greedy.
	MaxTokens   int
	Temperature float32
	Seed        *uint64
	Stop        []string
	IgnoreEOS   bool
}

// GenerateResult is how a direct generation ended.
type GenerateResult struct {
	FinishReason     string
	PromptTokens     int
	CompletionTokens int
}

// Generate runs p through the same path as the HTTP endpoints and calls onText with text
// as it becomes final.
func (s *Server) Generate(ctx context.Context, p GenerateParams, onText func(string) error) (GenerateResult, error) {
	var ids []int32
	var err error
	if p.Chat {
		if s.chat == nil {
			return GenerateResult{}, fmt.Errorf("generate: the tokenizer has no chat template")
		}
		var msgs []map[string]any
		if p.System != "" {
			msgs = append(msgs, map[string]any{"role": "system", "content": p.System})
		}
		msgs = append(msgs, map[string]any{"role": "user", "content": p.Prompt})
		text, err := s.chat.Render(msgs, tokenizer.ChatOptions{AddGenerationPrompt: true})
		if err != nil {
			return GenerateResult{}, fmt.Errorf("generate: %w", err)
		}
		ids, err = s.tok.Encode(text, false)
		if err != nil {
			return GenerateResult{}, fmt.Errorf("generate: %w", err)
		}
	} else if ids, err = s.tok.Encode(p.Prompt, true); err != nil {
		return GenerateResult{}, fmt.Errorf("generate: %w", err)
	}
	if len(ids) == 0 {
		return GenerateResult{}, fmt.Errorf("generate: the prompt is empty")
	}
	g := &genRequest{prompt: ids, stops: p.Stop, skipSpecial: true}
	g.sampling.MaxTokens = p.MaxTokens
	g.sampling.Temperature = p.Temperature
	g.sampling.IgnoreEOS = p.IgnoreEOS
	if p.Seed != nil {
		g.sampling.Seed, g.sampling.HasSeed = *p.Seed, true
	}
	res, err := s.generate(ctx, g, func(d delta) error {
		if d.text == "" {
			return nil
		}
		return onText(d.text)
	})
	if err != nil {
		return GenerateResult{}, fmt.Errorf("generate: %w", err)
	}
	return GenerateResult{FinishReason: res.finish, PromptTokens: res.usage.PromptTokens, CompletionTokens: res.usage.CompletionTokens}, nil
}

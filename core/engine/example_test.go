package engine_test

import (
	"context"
	"fmt"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

// An engine over the deterministic test runner: submit a request and read its stream.
func Example() {
	runner, err := enginetest.New(enginetest.Config{VocabSize: 256, MaxContext: 1024})
	if err != nil {
		panic(err)
	}
	e, err := engine.New(runner, engine.Config{Pool: runner.Pool(), MaxBatchTokens: 512, MaxSeqs: 16})
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go e.Run(ctx)

	st, err := e.Submit(ctx, engine.Request{
		ID:       "hello",
		Prompt:   []int32{1, 2, 3, 4},
		Sampling: engine.SamplingParams{MaxTokens: 8},
	})
	if err != nil {
		panic(err)
	}
	tokens, last, err := st.Collect(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println(len(tokens), last.Finish, last.Usage.PromptTokens, last.Usage.CompletionTokens)
	// Output: 8 length 4 8
}

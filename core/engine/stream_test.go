package engine_test

import (
	"context"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

// TestStreamLateReader: a reader that first looks after its request finished gets every
// token and the terminal event in that one event; a Recv after it returns io.EOF, and a
// Collect then reports io.ErrUnexpectedEOF, as the terminal event was already taken. (A
// test that read one event "to see the request decode" and collected the rest later met
// exactly this when the engine outran it.)
func TestStreamLateReader(t *testing.T) {
	rc := enginetest.Config{VocabSize: 100}
	h := start(t, rc, engine.Config{})
	prompt := []int32{1, 2, 3}
	st, err := h.e.Submit(context.Background(), engine.Request{Prompt: prompt, Sampling: engine.SamplingParams{MaxTokens: 20, IgnoreEOS: true}})
	if err != nil {
		t.Fatal(err)
	}
	for guard := time.Now().Add(time.Minute); !st.Done(); time.Sleep(time.Millisecond) {
		if time.Now().After(guard) {
			t.Fatal("the request never finished")
		}
	}
	ev, err := st.Recv(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := enginetest.Reference(rc.VocabSize, prompt, 20, engine.SamplingRow{Logprobs: -1})
	if ev.Finish != engine.FinishLength || ev.Err != nil || !slices.Equal(ev.Tokens, want) {
		t.Fatalf("first event of a finished request: finish %v (%v), tokens %v; want length and %v", ev.Finish, ev.Err, ev.Tokens, want)
	}
	if ev.Usage.CompletionTokens != 20 {
		t.Fatalf("usage %+v, want 20 completion tokens", ev.Usage)
	}
	if _, err := st.Recv(context.Background()); err != io.EOF {
		t.Fatalf("Recv after the terminal event: %v, want io.EOF", err)
	}
	if _, _, err := st.Collect(context.Background()); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("Collect after the terminal event: %v, want io.ErrUnexpectedEOF", err)
	}
}

package engine_test

import (
	"context"
	"errors"
	"io"
	"slices"
	"sync/atomic"
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

// TestStreamShowsAStepAtOnce: the tokens the scheduler gives a stream during a step are
// invisible to Recv until the step's flush, or until the finish that comes with them. A
// server reading concurrently once took a request's stop token without the finish reason
// that said it was one, and put the stop token's text in the answer.
func TestStreamShowsAStepAtOnce(t *testing.T) {
	st := engine.NewStreamForTest("r")
	out := st.AsOutput()
	f, ok := out.(engine.FlushOutput)
	if !ok {
		t.Fatal("a stream's Output is not a FlushOutput: the scheduler would never flush it")
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	nothing := func(when string) {
		t.Helper()
		if ev, err := st.Recv(done); err == nil {
			t.Fatalf("%s: Recv returned %+v before the step's flush", when, ev)
		}
	}
	nothing("new stream")
	out.Token(7, nil)
	out.Token(8, nil)
	nothing("two tokens given")
	f.Flush()
	ev, err := st.Recv(done)
	if err != nil || !slices.Equal(ev.Tokens, []int32{7, 8}) || ev.Finish != engine.FinishNone {
		t.Fatalf("after the flush: %+v, %v; want tokens [7 8], no finish", ev, err)
	}
	f.Flush()
	nothing("a flush of nothing")

	lp := engine.TokenLogprob{Token: 9, Logprob: -0.5}
	out.Token(9, &lp)
	nothing("the stop token given")
	out.Finish(engine.FinishStop, nil, engine.Usage{CompletionTokens: 3})
	ev, err = st.Recv(done)
	if err != nil || !slices.Equal(ev.Tokens, []int32{9}) || ev.Finish != engine.FinishStop || len(ev.Logprobs) != 1 || ev.Logprobs[0].Token != 9 || ev.Logprobs[0].Logprob != lp.Logprob {
		t.Fatalf("after the finish: %+v, %v; want token 9 with its logprob and finish stop", ev, err)
	}
	f.Flush()
	if _, err := st.Recv(done); err != io.EOF {
		t.Fatalf("Recv after the terminal event and a late flush: %v, want io.EOF", err)
	}
}

// TestStopTokenComesWithFinish: through a running engine, read as fast as events come,
// the event that carries a stop token also carries finish stop, every time.
func TestStopTokenComesWithFinish(t *testing.T) {
	rc := enginetest.Config{VocabSize: 100}
	h := start(t, rc, engine.Config{})
	for i := range 50 {
		prompt := []int32{1, 2, int32(3 + i)}
		ref := enginetest.Reference(rc.VocabSize, prompt, 8, engine.SamplingRow{Logprobs: -1})
		stopID := ref[len(ref)-1]
		stopAt := slices.Index(ref, stopID)
		st, err := h.e.Submit(context.Background(), engine.Request{Prompt: prompt, Sampling: engine.SamplingParams{MaxTokens: 8, IgnoreEOS: true, StopTokenIDs: []int32{stopID}}})
		if err != nil {
			t.Fatal(err)
		}
		var got []int32
		for {
			ev, err := st.Recv(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, ev.Tokens...)
			if slices.Contains(ev.Tokens, stopID) != (ev.Finish == engine.FinishStop) {
				t.Fatalf("prompt %v: event %+v: the stop token %d and finish stop come apart", prompt, ev, stopID)
			}
			if ev.Finish != engine.FinishNone {
				break
			}
		}
		if !slices.Equal(got, ref[:stopAt+1]) {
			t.Fatalf("prompt %v: tokens %v, want %v", prompt, got, ref[:stopAt+1])
		}
	}
}

// TestStreamDeliversBeforeTheEnd: a request's tokens reach its reader step by step while
// it runs, on every path that emits them (the plain decode row, logprobs, drafts, the
// async loop), not held until it finishes.
func TestStreamDeliversBeforeTheEnd(t *testing.T) {
	for _, c := range []struct {
		name string
		rc   enginetest.Config
		cfg  engine.Config
		sp   engine.SamplingParams
	}{
		{"plain", enginetest.Config{}, engine.Config{}, engine.SamplingParams{}},
		{"logprobs", enginetest.Config{}, engine.Config{}, engine.SamplingParams{Logprobs: true, TopLogprobs: 2}},
		{"drafts", enginetest.Config{MaxDrafts: 2}, engine.Config{}, engine.SamplingParams{}},
		{"async", enginetest.Config{Async: true}, engine.Config{Async: true}, engine.SamplingParams{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			gate := make(chan struct{})
			var steps atomic.Int64
			c.rc.VocabSize = 100
			c.rc.OnPlan = func(*engine.BatchPlan) {
				if steps.Add(1) > 4 {
					<-gate // the request stays running until the test has read
				}
			}
			h := start(t, c.rc, c.cfg)
			t.Cleanup(func() { close(gate) })
			c.sp.MaxTokens, c.sp.IgnoreEOS = 50, true
			st, err := h.e.Submit(context.Background(), engine.Request{Prompt: []int32{1, 2, 3}, Sampling: c.sp})
			if err != nil {
				t.Fatal(err)
			}
			// Four steps run before the gate: a prefill and three decodes, at least three
			// tokens the reader must get while the request waits at the gate.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var got []int32
			for len(got) < 3 {
				ev, err := st.Recv(ctx)
				if err != nil || ev.Finish != engine.FinishNone {
					t.Fatalf("after tokens %v, while the request runs: event %+v, %v; want more tokens, no finish", got, ev, err)
				}
				got = append(got, ev.Tokens...)
			}
		})
	}
}

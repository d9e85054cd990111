package loadgen

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/tokenizer/tiny"
)

func TestSeededPromptsRepeatAndUnseededDiffer(t *testing.T) {
	run := func(seed int64) (Report, []string) {
		t.Helper()
		f := &fakeOpenAI{tokenize: true}
		srv := f.start(t)
		rep, err := Run(context.Background(), Config{BaseURL: srv.URL, Requests: 8, Concurrency: 4, PromptLen: 24, OutputTokens: 3, Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		return rep, f.sortedPrompts()
	}
	rep1, seeded1 := run(42)
	rep2, seeded2 := run(42)
	if !slices.Equal(seeded1, seeded2) {
		t.Fatalf("seed 42 gave different prompts:\n%q\n%q", seeded1, seeded2)
	}
	if rep1.Seed != 42 || rep1.SeedDrawn || rep2.Seed != 42 {
		t.Fatalf("seeded reports name seed %d (drawn %v) and %d", rep1.Seed, rep1.SeedDrawn, rep2.Seed)
	}
	if len(slices.Compact(slices.Clone(seeded1))) != len(seeded1) {
		t.Fatalf("one run repeated a prompt: %q", seeded1)
	}

	drawnA, promptsA := run(0)
	drawnB, promptsB := run(0)
	if !drawnA.SeedDrawn || drawnA.Seed == 0 || drawnA.Seed == drawnB.Seed {
		t.Fatalf("unseeded runs drew seeds %d and %d (drawn %v)", drawnA.Seed, drawnB.Seed, drawnA.SeedDrawn)
	}
	if slices.Equal(promptsA, promptsB) || slices.Equal(promptsA, seeded1) {
		t.Fatal("unseeded runs repeated prompts")
	}
	var table strings.Builder
	drawnA.WriteTable(&table)
	if want := "--seed " + itoa(drawnA.Seed); !strings.Contains(table.String(), want) {
		t.Fatalf("the report does not say how to repeat the run (%q):\n%s", want, table.String())
	}
	if _, again := run(drawnA.Seed); !slices.Equal(again, promptsA) {
		t.Fatal("the drawn seed, given back, did not repeat the prompts")
	}
}

func TestPromptLenInTokensThroughTokenize(t *testing.T) {
	for _, chat := range []bool{false, true} {
		f := &fakeOpenAI{tokenize: true}
		srv := f.start(t)
		warned := false
		rep, err := Run(context.Background(), Config{
			BaseURL: srv.URL, Chat: chat, Requests: 10, Concurrency: 3, PromptLen: 100, OutputTokens: 3, Seed: 5,
			Warn: func(string) { warned = true },
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.sortedPrompts() {
			if n := fakeCount(p); n != 100 {
				t.Fatalf("chat=%v: a prompt of %d tokens, want 100: %q", chat, n, p)
			}
		}
		if rep.PromptCountedBy != CountedByServer || rep.PromptBuiltTokens != 100 || rep.MeanPromptTokens != 100 {
			t.Fatalf("chat=%v: counted by %q, built %v, mean in usage %v", chat, rep.PromptCountedBy, rep.PromptBuiltTokens, rep.MeanPromptTokens)
		}
		if warned || len(rep.Warnings) > 0 || f.tokenizeCalls.Load() == 0 {
			t.Fatalf("chat=%v: warnings %q, %d /tokenize calls", chat, rep.Warnings, f.tokenizeCalls.Load())
		}
	}
}

func TestPromptLenFallsBackToTokenizerThenWords(t *testing.T) {
	tok, _, err := tiny.Load()
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeOpenAI{}
	srv := f.start(t)
	rep, err := Run(context.Background(), Config{BaseURL: srv.URL, Requests: 6, Concurrency: 2, PromptLen: 64, OutputTokens: 3, Tokenizer: tok})
	if err != nil {
		t.Fatal(err)
	}
	if rep.PromptCountedBy != CountedByTokenizer || len(rep.Warnings) > 0 {
		t.Fatalf("counted by %q, warnings %q", rep.PromptCountedBy, rep.Warnings)
	}
	for _, p := range f.sortedPrompts() {
		if ids, _ := tok.Encode(p, true); len(ids) != 64 {
			t.Fatalf("a prompt of %d tokens by the tokenizer, want 64: %q", len(ids), p)
		}
	}

	f = &fakeOpenAI{}
	srv = f.start(t)
	var warning string
	rep, err = Run(context.Background(), Config{BaseURL: srv.URL, Requests: 4, Concurrency: 2, PromptLen: 16, OutputTokens: 3,
		Warn: func(m string) { warning = m }})
	if err != nil {
		t.Fatal(err)
	}
	if rep.PromptCountedBy != CountedByWords || warning == "" || !slices.Equal(rep.Warnings, []string{warning}) {
		t.Fatalf("counted by %q, warned %q, report warnings %q", rep.PromptCountedBy, warning, rep.Warnings)
	}
	if !strings.Contains(warning, "words") || !strings.Contains(warning, "--tokenizer") {
		t.Fatalf("the warning does not name the fallback: %q", warning)
	}
	for _, p := range f.sortedPrompts() {
		if n := len(strings.Fields(p)); n != 16 {
			t.Fatalf("a prompt of %d words, want 16", n)
		}
	}
}

func TestTokenizeErrorStopsTheRun(t *testing.T) {
	srv := httptestServer(t, func(path string) int {
		if path == "/tokenize" {
			return 401
		}
		return 200
	})
	_, err := Run(context.Background(), Config{BaseURL: srv.URL, Requests: 1, Concurrency: 1, PromptLen: 4, OutputTokens: 1})
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("error %v, want the /tokenize 401", err)
	}
}

// countFunc counts with a function, for buildPrompt's own tests.
type countFunc func(string) int

func (f countFunc) count(_ context.Context, text string) (int, error) { return f(text), nil }

func TestBuildPromptHitsTheTarget(t *testing.T) {
	tok, _, err := tiny.Load()
	if err != nil {
		t.Fatal(err)
	}
	counters := map[string]counter{
		"words+letters": countFunc(fakeCount),
		// tokens that cross word boundaries: one per 3 bytes of the whole text
		"bytes/3":        countFunc(func(s string) int { return (len(s) + 2) / 3 }),
		"tiny tokenizer": localTokenizer{tok},
	}
	for name, c := range counters {
		for _, target := range []int{1, 7, 64, 300} {
			for i := range 6 {
				guess := []int{0, 1, target / 3, 3 * target}[i%4] // near or far from the answer
				text, n, err := buildPrompt(context.Background(), c, promptRand(9, i), target, guess)
				if err != nil {
					t.Fatal(err)
				}
				if got, _ := c.count(context.Background(), text); got != n {
					t.Fatalf("%s: built %d tokens but the text counts %d", name, n, got)
				}
				// A single word can exceed a tiny target; beyond that every length is reachable.
				if n != target && target > 1 {
					t.Fatalf("%s: target %d, built %d: %q", name, target, n, text)
				}
			}
		}
	}
}

func TestBuildPromptNearestWhenNoWordFits(t *testing.T) {
	// Every word takes two tokens after a start token: even targets cannot be met.
	c := countFunc(func(s string) int { return 1 + 2*len(strings.Fields(s)) })
	text, n, err := buildPrompt(context.Background(), c, promptRand(1, 0), 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n != 9 || len(strings.Fields(text)) != 4 {
		t.Fatalf("built %d tokens (%d words), want the nearest below: 9", n, len(strings.Fields(text)))
	}
}

package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/tokenizer/tiny"
	"github.com/resin-llm/resin/core/weights"
	"github.com/resin-llm/resin/models/llama"
)

func TestGenerateMatchesRunnerReference(t *testing.T) {
	cmd := newGenerateCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"--max-tokens", "24", "--stats", "Once upon a time"})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("generate: %v (%s)", err, errOut.String())
	}
	tok, _, err := tiny.Load()
	if err != nil {
		t.Fatal(err)
	}
	eos := endTokens(tok)
	ids, _ := tok.Encode("Once upon a time", true)
	toks := enginetest.Reference(tok.VocabSize(), ids, 24, engine.SamplingRow{Logprobs: -1}, eos...)
	if slices.Contains(eos, toks[len(toks)-1]) {
		toks = toks[:len(toks)-1]
	}
	if want := tok.Decode(toks, true) + "\n"; out.String() != want {
		t.Fatalf("generate printed %q, want %q", out.String(), want)
	}
	if !strings.Contains(errOut.String(), "prompt_tokens=") {
		t.Fatalf("no stats line: %q", errOut.String())
	}
}

func TestGenerateRejectsUnknownRunner(t *testing.T) {
	cmd := newGenerateCmd()
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"--runner", "gpt-5", "hi"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "unknown runner") {
		t.Fatalf("error %v", err)
	}
}

// TestGenerateModelDir: --model DIR, the spelling of a scaffolded runtime's generate, runs
// the checkpoint in DIR with the model its architectures name, as --model auto --weights
// DIR does (it was read as a model name: unknown model).
func TestGenerateModelDir(t *testing.T) {
	m := tinyLlamaModel(t)
	dir := tinyLlamaDir(t)
	if err := llama.RandomWeights(m.Config, 1).Save(m.Config, dir, weights.F32); err != nil {
		t.Fatal(err)
	}
	args := []string{"--max-tokens", "6", "--ignore-eos", "--prompt-ids", "5,6,7"}
	want, _, err := runGenerate(t, append([]string{"--model", "auto", "--weights", dir}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	got, errOut, err := runGenerate(t, append([]string{"--model", dir}, args...)...)
	if err != nil {
		t.Fatalf("--model %s: %v (%s)", dir, err, errOut)
	}
	tokens := func(out string) string { // the output but for its timing
		i := strings.Index(out, "tokens: ")
		if i < 0 {
			return out
		}
		return out[i : i+strings.Index(out[i:], "\n")]
	}
	if !strings.Contains(got, "tokens: [") || tokens(got) != tokens(want) {
		t.Errorf("--model DIR printed\n%s\n--model auto --weights DIR\n%s", got, want)
	}
	// A registered name stays a name; a directory without config.json is no checkpoint.
	if _, _, err := runGenerate(t, "--model", "llama", "hi"); err == nil || !strings.Contains(err.Error(), "needs --weights DIR") {
		t.Errorf("--model llama alone: %v", err)
	}
	if _, _, err := runGenerate(t, "--model", t.TempDir(), "hi"); err == nil || !strings.Contains(err.Error(), "without config.json") {
		t.Errorf("--model of a directory without config.json: %v", err)
	}
}

// TestGenerateTestRunnerSaysItIsNotAModel: without --model, generate's text is the test
// runner's pseudo-random tokens; a note on stderr says so (a newcomer's first `resin
// generate "Hello"` printed gibberish without a word why). A model run prints no such note.
func TestGenerateTestRunnerSaysItIsNotAModel(t *testing.T) {
	const note = "pseudo-random tokens"
	_, errOut, err := runGenerate(t, "--max-tokens", "4", "Hello")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(errOut, note) != 1 {
		t.Errorf("stderr %q, want one note with %q", errOut, note)
	}
	_, errOut, err = runGenerate(t, "--model", "llama", "--random-weights", tinyLlama, "--max-tokens", "2", "--prompt-ids", "1,2")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(errOut, note) {
		t.Errorf("a model run printed the test runner's note: %q", errOut)
	}
}

// TestGenerateTextOnASmallVocabulary: the in-tree configs' seeded random weights have 512
// tokens, fewer than the built-in tiny tokenizer's 1025, and a text prompt used to be
// refused ("not the model's tokenizer", while the message said the tiny tokenizer serves
// random weights). The tokenizer is now cut to the model's vocabulary: the prompt runs,
// every id fits, and a note says so.
func TestGenerateTextOnASmallVocabulary(t *testing.T) {
	for _, m := range []string{"llama", "deepseek-v4-flash"} {
		out, errOut, err := runGenerate(t, "--model", m, "--random-weights", "../../models/"+m+"/config.json", "--max-tokens", "3", "Hello there")
		if err != nil {
			t.Fatalf("%s: %v (stderr %q)", m, err, errOut)
		}
		if !strings.Contains(errOut, "cut to the model's 512 tokens") {
			t.Errorf("%s: stderr %q, want the note on the cut tokenizer", m, errOut)
		}
		if out == "" {
			t.Errorf("%s: no text", m)
		}
	}
	// Fewer tokens than the tokenizer's byte tokens (the parity configs' 128): no
	// tokenizer, token ids run as before, a text prompt is refused as needing one.
	small := []string{"--model", "glm-5-flash", "--random-weights", "../../models/glm-5-flash/testdata/parity/module/config.json", "--max-tokens", "2"}
	if out, errOut, err := runGenerate(t, append(small, "--prompt-ids", "1,2")...); err != nil || !strings.Contains(out, "tokens: [") || !strings.Contains(errOut, "no tokenizer") {
		t.Errorf("128 tokens, --prompt-ids: %v, stdout %q, stderr %q", err, out, errOut)
	}
	if _, errOut, err := runGenerate(t, append(small, "Hello")...); err == nil || !strings.Contains(err.Error()+errOut, "needs a tokenizer") {
		t.Errorf("128 tokens, a text prompt: %v (%s), want it refused as needing a tokenizer", err, errOut)
	}
}

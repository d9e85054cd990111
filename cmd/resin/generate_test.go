package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/tokenizer/tiny"
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

package models

import (
	"context"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
)

func TestRegistry(t *testing.T) {
	seen := map[string]bool{}
	for _, m := range All() {
		if m.Name == "" || m.Open == nil || len(m.Architectures) == 0 {
			t.Errorf("incomplete entry %+v", m)
		}
		if seen[m.Name] {
			t.Errorf("%s registered twice", m.Name)
		}
		seen[m.Name] = true
	}
	if _, err := Lookup("no-such-model"); err == nil || !strings.Contains(err.Error(), "llama") {
		t.Errorf("Lookup of an unknown model: %v (want the registered names listed)", err)
	}
	m, err := ForArchitecture("LlamaForCausalLM")
	if err != nil || m.Name != "llama" {
		t.Fatalf("ForArchitecture(LlamaForCausalLM) = %v, %v", m.Name, err)
	}
	if _, err := ForArchitecture("GPT2LMHeadModel"); err == nil {
		t.Error("ForArchitecture(GPT2LMHeadModel) succeeded")
	}
}

// TestOpenLlama opens models/llama through the registry (its config.json, random weights)
// and generates through the engine.
func TestOpenLlama(t *testing.T) {
	m, err := Lookup("llama")
	if err != nil {
		t.Fatal(err)
	}
	r, pool, err := m.Open("llama", 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(r, engine.Config{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	defer func() { cancel(); <-done; e.Close() }()
	s, err := e.Submit(ctx, engine.Request{Prompt: []int32{1, 2, 3}, Sampling: engine.SamplingParams{MaxTokens: 5, IgnoreEOS: true}})
	if err != nil {
		t.Fatal(err)
	}
	toks, ev, err := s.Collect(ctx)
	if err != nil || ev.Err != nil || len(toks) != 5 || ev.Finish != engine.FinishLength {
		t.Fatalf("generated %v, finish %v, err %v %v", toks, ev.Finish, err, ev.Err)
	}
	if _, _, err := m.Open("no/such/dir", 0); err == nil {
		t.Error("opening a missing directory succeeded")
	}
}

package main

import (
	"strings"
	"testing"
)

// TestGenerateTP: `resin generate --tp 2` on the tiny llama prints what --tp 1 prints
// (the greedy tokens of the same model, its layers split over two in-process ranks); a
// split the heads do not divide, --tp 0 and --tp without a model are refused by name.
func TestGenerateTP(t *testing.T) {
	args := []string{"--model", "llama", "--random-weights", tinyLlama, "--cache-bytes", "4000000",
		"--max-tokens", "16", "--ignore-eos", "Once upon a time"}
	want, errOut, err := runGenerate(t, args...)
	if err != nil {
		t.Fatalf("%v (%s)", err, errOut)
	}
	got, errOut, err := runGenerate(t, append([]string{"--tp", "2"}, args...)...)
	if err != nil {
		t.Fatalf("--tp 2: %v (%s)", err, errOut)
	}
	if got != want {
		t.Fatalf("--tp 2 printed %q, --tp 1 %q", got, want)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{append([]string{"--tp", "3"}, args...), "do not all divide by tp=3"},
		{append([]string{"--tp", "0"}, args...), "--tp 0"},
		{[]string{"--tp", "2", "--max-tokens", "2", "hi"}, "--tp needs --model llama"},
	} {
		_, errOut, err := runGenerate(t, c.args...)
		if err == nil || !strings.Contains(err.Error()+errOut, c.want) {
			t.Fatalf("%v: %v (%s), want an error saying %q", c.args[:2], err, errOut, c.want)
		}
	}
}

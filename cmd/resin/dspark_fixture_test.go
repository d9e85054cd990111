package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/dspark/fixture"
)

// specFigures are the figures of bench's or generate's "speculative:" line.
type specFigures struct {
	proposed, accepted, verifications int
	mean                              float64 // accepted drafts per verification
}

// specLine parses out's "speculative:" line; ok false when there is none.
func specLine(t *testing.T, out string) (f specFigures, ok bool) {
	t.Helper()
	i := strings.Index(out, "speculative: ")
	if i < 0 {
		return f, false
	}
	var pct int
	if _, err := fmt.Sscanf(out[i:], "speculative: %d drafts proposed, %d accepted (%d%%), mean accepted length %g over %d verifications",
		&f.proposed, &f.accepted, &pct, &f.mean, &f.verifications); err != nil {
		t.Fatalf("%v in\n%s", err, out)
	}
	return f, true
}

// TestBenchDSparkFixture runs `bench model` on core/dspark/fixture's checkpoints (the
// target whose greedy next token is t+1, read by models/llama's loader): without DSpark
// nothing is drafted; with the forced-right drafter every draft the engine verifies is
// accepted, so each verification accepts a whole block but where max tokens cut it; with
// the random one almost none is. The target's greedy output is checked through generate
// first, so the full acceptance is the drafter's, not a target that takes anything.
func TestBenchDSparkFixture(t *testing.T) {
	s := fixture.Tiny
	p, err := fixture.Write(t.TempDir(), s)
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, err := runGenerate(t, "--model", "llama", "--weights", p.Target, "--prompt-ids", "30,3", "--max-tokens", "6",
		"--speculative-method", "dspark", "--draft-model", p.Forced)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	if got := tokensLine(out); got != "tokens: [4 5 6 7 8 9]" {
		t.Fatalf("generate on the fixture target: %q, want t+1 after t", got)
	}
	bench := func(extra ...string) string {
		cmd := newBenchCmd()
		var out, errOut bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&errOut)
		cmd.SetArgs(append([]string{"model", "--model", "llama", "--weights", p.Target, "--requests", "3", "--concurrency", "2",
			"--prompt-len", "5", "--gen-len", "21"}, extra...))
		if err := cmd.Execute(); err != nil {
			t.Fatalf("bench %v: %v\n%s", extra, err, errOut.String())
		}
		return out.String()
	}
	if out := bench(); strings.Contains(out, "speculative:") || !strings.Contains(out, "tokens/s") {
		t.Errorf("bench without DSpark:\n%s", out)
	}
	out = bench("--speculative-method", "dspark", "--draft-model", p.Forced)
	f, ok := specLine(t, out)
	proposed, accepted, verifications := f.proposed, f.accepted, f.verifications
	// 21 tokens: the prefill's, then 4 blocks of 4 drafts and a bonus token, drafts fed
	// only while tokens remain: at least 3 whole blocks per request.
	if !ok || proposed == 0 || accepted != proposed || accepted < 3*3*s.BlockSize {
		t.Errorf("forced-right drafter: %d proposed, %d accepted over %d verifications, want all accepted, ≥ %d:\n%s",
			proposed, accepted, verifications, 3*3*s.BlockSize, out)
	}
	out = bench("--speculative-method", "dspark", "--draft-model", p.Random)
	f, ok = specLine(t, out)
	proposed, accepted = f.proposed, f.accepted
	if !ok || proposed < 3*20 || accepted*10 > proposed {
		t.Errorf("random drafter: %d proposed, %d accepted, want drafting on every step and under 10%% accepted:\n%s", proposed, accepted, out)
	}
}

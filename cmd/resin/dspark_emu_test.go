package main

import (
	"path/filepath"
	"testing"

	"github.com/resin-llm/resin/core/cudart/emutest"
)

// TestGenerateDSparkEmulated: `generate --device cuda-emu --speculative-method dspark
// --draft-model DIR` runs the target with its feature tap and the drafter's block forward
// on the emulated device; its greedy tokens equal the emulated device's without DSpark, and
// drafts are proposed and reported.
func TestGenerateDSparkEmulated(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	args := []string{"--model", "llama", "--weights", dsparkTarget, "--prompt-ids", "1,2,3,4", "--max-tokens", "16", "--device", "cuda-emu"}
	plain, errOut, err := runGenerate(t, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	out, errOut, err := runGenerate(t, append(args, "--speculative-method", "dspark", "--draft-model", filepath.Join(dsparkDir, "rnn"))...)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	if tokensLine(out) == "" || tokensLine(out) != tokensLine(plain) {
		t.Errorf("DSpark on the emulated device %q, without %q", tokensLine(out), tokensLine(plain))
	}
	f, ok := specLine(t, out)
	if !ok || f.proposed == 0 {
		t.Errorf("no drafts proposed:\n%s", out)
	}
	t.Logf("%d drafts proposed, %d accepted", f.proposed, f.accepted)
}

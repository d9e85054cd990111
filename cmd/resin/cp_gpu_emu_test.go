package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart/emutest"
)

// TestGenerateCPOnTheEmulatedDevice: generate --device cuda-emu --cp 2 and --cp 3 run
// llama's GPU runner with prefill context parallelism over ranks of this process
// (gpurunner.NewDenseCPShards; a 7-token prompt split 4+3 and 3+3+1) or, with
// --cp-procs, ranks 1.. worker processes (gpurunner.JoinDenseCP; --cp 3 with plans of 4
// tokens too, the second chunk over cached keys) and give --cp 1's greedy tokens and,
// with --logits-out, its logits file byte for byte, leaving no worker process.
func TestGenerateCPOnTheEmulatedDevice(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=3") {
		return
	}
	args := []string{"--model", "llama", "--random-weights", filepath.Join("testdata", "tiny-llama", "config.json"),
		"--prompt-ids", "1,2,3,4,5,6,7", "--max-tokens", "8", "--device", "cuda-emu"}
	one := checkCPLayouts(t, args, false)
	// Without --logits-out a prompt's chunks before its last have no logits rows: rank 2
	// of 2+2+0 skips the head as the others do (it failed on it, and rank 0 waited).
	stdout, errOut, err := runGenerate(t, append(args, "--cp", "3", "--cp-procs", "--max-batch-tokens", "4")...)
	if err != nil || tokensLine(stdout) != one {
		t.Errorf("--cp 3 --cp-procs --max-batch-tokens 4 without --logits-out: %q, --cp 1 %q (%v)\n%s", tokensLine(stdout), one, err, errOut)
	}
	if pids := childWorkers(t); len(pids) > 0 {
		t.Errorf("worker processes %v left after --cp-procs", pids)
	}
}

// TestGenerateCPTPOnTheEmulatedDevice: generate --device cuda-emu --cp 2 --tp 2 runs
// llama's GPU runner with prefill CP over two TP groups (gpurunner.NewDenseCPTP; a
// 7-token prompt split 4+3, and in plans of 4 tokens the second over cached keys), with
// ranks 1..3 worker processes (--cp-procs, --tp-procs: gpurunner.JoinDenseCPTP) and over
// two nodes (a TP group each), and gives --tp 2's greedy tokens and --logits-out byte for
// byte, leaving no worker process.
func TestGenerateCPTPOnTheEmulatedDevice(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=4") {
		return
	}
	dir := t.TempDir()
	run := func(extra ...string) (string, []byte) {
		out := filepath.Join(dir, "logits"+strings.Join(extra, ""))
		args := []string{"--model", "llama", "--random-weights", filepath.Join("testdata", "tiny-llama", "config.json"),
			"--prompt-ids", "1,2,3,4,5,6,7", "--max-tokens", "8", "--device", "cuda-emu", "--logits-out", out}
		stdout, errOut, err := runGenerate(t, append(args, extra...)...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", extra, err, errOut)
		}
		if slices.Contains(extra, "--cp") && !slices.Contains(extra, "--cp-procs") && !slices.Contains(extra, "--tp-procs") {
			// Every rank says where it is (workers' lines go to the parent's stderr, which
			// runGenerate does not hold).
			for w := range 4 {
				if want := fmt.Sprintf("gpu: cp×tp rank %d of 4: tp rank %d of 2, cp rank %d of 2", w, w%2, w/2); !strings.Contains(errOut, want) {
					t.Errorf("%v: no %q in\n%s", extra, want, errOut)
				}
			}
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		return tokensLine(stdout), b
	}
	tp, tpLogits := run("--tp", "2")
	for _, extra := range [][]string{{"--cp", "2", "--tp", "2"}, {"--cp", "2", "--tp", "2", "--max-batch-tokens", "4"},
		{"--cp", "2", "--tp", "2", "--cp-procs"}, {"--cp", "2", "--tp", "2", "--tp-procs", "--max-batch-tokens", "4"}} {
		toks, logits := run(extra...)
		if toks == "" || toks != tp {
			t.Errorf("%v: %q, --tp 2 %q", extra, toks, tp)
		}
		if len(tpLogits) == 0 || !bytes.Equal(logits, tpLogits) {
			t.Errorf("%v: --logits-out differs from --tp 2's (%d and %d bytes)", extra, len(logits), len(tpLogits))
		}
	}
	if pids := childWorkers(t); len(pids) > 0 {
		t.Errorf("worker processes %v left after --cp-procs", pids)
	}
	args := []string{"--model", "llama", "--random-weights", filepath.Join("testdata", "tiny-llama", "config.json"),
		"--prompt-ids", "1,2,3,4,5,6,7", "--max-tokens", "8", "--device", "cuda-emu"}
	got, lg := generateOverTwoNodes(t, args, []string{"--cp", "2", "--tp", "2"})
	if tokensLine(got) != tp || !bytes.Equal(lg, tpLogits) {
		t.Errorf("--cp 2 --tp 2 over two GPU nodes: %q, --logits-out %d bytes; --tp 2 %q, %d bytes (equal: %v)", tokensLine(got), len(lg), tp, len(tpLogits), bytes.Equal(lg, tpLogits))
	}
}

// TestGenerateMoECPOnTheEmulatedDevice: generate --model deepseek-v4-flash|glm-5-flash
// --device cuda-emu --cp 2 and --cp 3 run the model's GPU runner with prefill context
// parallelism over ranks of this process (OpenGPUCP) or, with --cp-procs, ranks 1..
// worker processes (JoinGPUCP; --cp 3 with plans of 4 tokens too, a rank of the second
// plan's without tokens), and give --cp 1's greedy tokens and --logits-out byte for byte,
// leaving no worker process. glm-5-flash's prompt is 20 tokens: its KDA layers'
// recurrence crosses a block end, its indexer's pools close across the ranks' chunks.
func TestGenerateMoECPOnTheEmulatedDevice(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=3") {
		return
	}
	for _, c := range []struct {
		model, prompt string
		chunksRound   bool
	}{{"deepseek-v4-flash", "1,2,3,4,5,6,7", false}, {"glm-5-flash", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20", true}} {
		cfg := filepath.Join("..", "..", "models", c.model, "config.json")
		checkCPLayouts(t, []string{"--model", c.model, "--random-weights", cfg, "--prompt-ids", c.prompt, "--max-tokens", "4", "--device", "cuda-emu"}, c.chunksRound)
		if pids := childWorkers(t); len(pids) > 0 {
			t.Errorf("%s: worker processes %v left after --cp-procs", c.model, pids)
		}
	}
}

// checkCPLayouts runs generate args with --cp 1, 2 and 3, in-process and with --cp-procs
// (--cp 3 with plans of 4 tokens too), and checks that every split prints --cp 1's tokens
// and writes its --logits-out byte for byte; it returns --cp 1's tokens line. With
// chunksRound (a model whose prompt in chunks rounds otherwise: glm-5-flash's KDA
// recurrence runs chunk by chunk) the plans of 4 are compared with --cp 1's plans of 4.
func checkCPLayouts(t *testing.T, args []string, chunksRound bool) string {
	t.Helper()
	dir := t.TempDir()
	run := func(cp string, extra ...string) (string, []byte) {
		out := filepath.Join(dir, "logits-"+cp+strings.Join(extra, ""))
		stdout, errOut, err := runGenerate(t, append(append(slices.Clone(args), "--cp", cp, "--logits-out", out), extra...)...)
		if err != nil {
			t.Fatalf("--cp %s %v: %v\n%s", cp, extra, err, errOut)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		return tokensLine(stdout), b
	}
	one, oneLogits := run("1")
	for _, c := range []struct {
		cp    string
		extra []string
	}{{"2", nil}, {"3", nil}, {"2", []string{"--cp-procs"}}, {"3", []string{"--cp-procs", "--max-batch-tokens", "4"}}} {
		wantToks, want := one, oneLogits
		if plans := slices.DeleteFunc(slices.Clone(c.extra), func(f string) bool { return f == "--cp-procs" }); len(plans) > 0 && chunksRound {
			wantToks, want = run("1", plans...)
		}
		toks, logits := run(c.cp, c.extra...)
		if toks == "" || toks != wantToks {
			t.Errorf("--cp %s %v: %q, --cp 1 %q", c.cp, c.extra, toks, wantToks)
		}
		if len(want) == 0 || !bytes.Equal(logits, want) {
			t.Errorf("--cp %s %v: --logits-out differs from --cp 1's (%d and %d bytes)", c.cp, c.extra, len(logits), len(want))
		}
	}
	return one
}

// TestGenerateCPOverEPOnTheEmulatedDevice: generate --device cuda-emu --cp 2 --ep 2 runs
// the MoE models' expert-parallel GPU layout with the ep ranks splitting the prompt
// (Layout.CP) in-process, with --cp-procs and over two nodes, and prints --ep 2's tokens
// and writes its --logits-out byte for byte (a split step's MoE sums the same partials),
// by the all-to-all dispatch too; --cp with another --ep, or on the CPU, is refused naming
// what it needs.
func TestGenerateCPOverEPOnTheEmulatedDevice(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	for _, model := range []string{"deepseek-v4-flash", "glm-5-flash"} {
		args := []string{"--model", model, "--random-weights", filepath.Join("..", "..", "models", model, "config.json"),
			"--prompt-ids", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20", "--max-tokens", "4", "--device", "cuda-emu"}
		dir := t.TempDir()
		run := func(extra ...string) (string, []byte) {
			out := filepath.Join(dir, "logits"+strings.Join(extra, ""))
			stdout, errOut, err := runGenerate(t, append(append(slices.Clone(args), "--logits-out", out), extra...)...)
			if err != nil {
				t.Fatalf("%s %v: %v\n%s", model, extra, err, errOut)
			}
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			return tokensLine(stdout), b
		}
		ep, epLogits := run("--ep", "2")
		for _, extra := range [][]string{{"--cp", "2", "--ep", "2"}, {"--cp", "2", "--ep", "2", "--cp-procs"}} {
			if toks, logits := run(extra...); toks == "" || toks != ep || !bytes.Equal(logits, epLogits) {
				t.Errorf("%s %v: %q, --ep 2 %q; logits equal %v", model, extra, toks, ep, bytes.Equal(logits, epLogits))
			}
		}
		// The all-to-all dispatch: each rank's chunk is its share of the rows.
		a2a, a2aLogits := run("--ep", "2", "--ep-dispatch", "all-to-all")
		if toks, logits := run("--cp", "2", "--ep", "2", "--ep-dispatch", "all-to-all", "--cp-procs"); toks == "" || toks != a2a || !bytes.Equal(logits, a2aLogits) {
			t.Errorf("%s --cp 2 --ep 2 --ep-dispatch all-to-all --cp-procs: %q, --ep 2 by all-to-all %q; logits equal %v", model, toks, a2a, bytes.Equal(logits, a2aLogits))
		}
		got, lg := generateOverTwoNodes(t, args, []string{"--cp", "2", "--ep", "2"})
		if tokensLine(got) != ep || !bytes.Equal(lg, epLogits) {
			t.Errorf("%s --cp 2 --ep 2 over two nodes: %q, --ep 2 %q; logits equal %v", model, tokensLine(got), ep, bytes.Equal(lg, epLogits))
		}
		if pids := childWorkers(t); len(pids) > 0 {
			t.Errorf("%s: worker processes %v left after --cp-procs", model, pids)
		}
		for _, c := range []struct {
			bad  []string
			want string
		}{
			{[]string{"--cp", "2", "--ep", "3"}, "--cp 2 --ep 3: prefill CP over the ep ranks splits each prompt over those same ranks, so --ep must equal --cp"},
			{[]string{"--cp", "2", "--ep", "2", "--device", "cpu"}, "prefill CP over the ep ranks runs on the GPU"},
		} {
			_, errOut, err := runGenerate(t, append(slices.Clone(args), c.bad...)...)
			if err == nil || !strings.Contains(errOut+err.Error(), c.want) {
				t.Errorf("%s %v: err %v, stderr %q; want it to say %q", model, c.bad, err, errOut, c.want)
			}
		}
	}
}

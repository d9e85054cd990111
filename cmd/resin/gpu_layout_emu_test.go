package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cli"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/models"
)

// TestGenerateParallelOnTheEmulatedDevice: generate --model glm-5-flash --device cuda-emu --ep 3
// runs its GPU runner over three emulated GPUs (the package config's 8 routed experts split
// 3 + 3 + 2, the all-reduces on the emulated NCCL), and its greedy tokens equal the CPU
// runner's, with 2 MTP drafts a step too, and so do --tp 2 and --tp 2 --ep 2 with drafts
// (the heads and columns split), and --ep 3, --ep 2 and --tp 2 --ep 2 with drafts by the
// all-to-all dispatch (each rank sending its share of the rows; under --tp its shared
// experts' partials summed); the all-to-all dispatch with --tp alone is refused.
func TestGenerateParallelOnTheEmulatedDevice(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	cfg := filepath.Join("..", "..", "models", "glm-5-flash", "config.json")
	args := []string{"--model", "glm-5-flash", "--random-weights", cfg, "--prompt-ids", "1,2,3,4,5", "--max-tokens", "6"}
	cpu, errOut, err := runGenerate(t, args...)
	if err != nil {
		t.Fatalf("on the CPU: %v\n%s", err, errOut)
	}
	for _, extra := range [][]string{{"--ep", "3"}, {"--ep", "3", "--num-speculative-tokens", "2"},
		{"--tp", "2", "--num-speculative-tokens", "2"}, {"--tp", "2", "--ep", "2", "--num-speculative-tokens", "2"},
		{"--ep", "3", "--ep-dispatch", "all-to-all"}, {"--ep", "2", "--ep-dispatch", "all-to-all", "--num-speculative-tokens", "2"},
		{"--tp", "2", "--ep", "2", "--ep-dispatch", "all-to-all", "--num-speculative-tokens", "2"}} {
		gpu, errOut, err := runGenerate(t, append(append(args, "--device", "cuda-emu"), extra...)...)
		if err != nil {
			t.Fatalf("--device cuda-emu %s: %v\n%s", strings.Join(extra, " "), err, errOut)
		}
		if tokensLine(gpu) == "" || tokensLine(gpu) != tokensLine(cpu) {
			t.Errorf("--device cuda-emu %s: %q, CPU %q", strings.Join(extra, " "), tokensLine(gpu), tokensLine(cpu))
		}
		if n := os.Getenv("RESIN_EMU_DEVICES"); n != "3" {
			t.Errorf("--device cuda-emu %s: the emulator shows %q GPUs, want 3 (openLayoutGPU set it for --ep 3)", strings.Join(extra, " "), n)
		}
	}
	if _, _, err := runGenerate(t, append(args, "--device", "cuda-emu", "--tp", "2", "--ep-dispatch", "all-to-all")...); err == nil || !strings.Contains(err.Error(), "needs --ep 2 or more") {
		t.Errorf("--tp 2 --ep-dispatch all-to-all on the device: %v, want a refusal naming --ep", err)
	}
}

// TestGenerateV4ParallelOnTheEmulatedDevice: generate --model deepseek-v4-flash --device
// cuda-emu --ep 3 runs its GPU runner over three emulated GPUs (the package config's 8
// routed experts split 3 + 3 + 2, the MoE all-reduces on the emulated NCCL), --ep 2 with 2
// MTP drafts a step, --tp 2 (heads, columns and vocabulary split), --tp 2 --ep 2, and
// --ep 3, --ep 2 with drafts and --tp 2 --ep 2 (in-process and --tp-procs) by the
// all-to-all dispatch (each rank sending its share of the rows), and their greedy tokens
// equal the CPU runner's; the all-to-all dispatch with --tp alone, or another --ep, is
// refused.
func TestGenerateV4ParallelOnTheEmulatedDevice(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	cfg := filepath.Join("..", "..", "models", "deepseek-v4-flash", "config.json")
	args := []string{"--model", "deepseek-v4-flash", "--random-weights", cfg, "--prompt-ids", "1,2,3,4,5", "--max-tokens", "6"}
	cpu, errOut, err := runGenerate(t, args...)
	if err != nil {
		t.Fatalf("on the CPU: %v\n%s", err, errOut)
	}
	for _, extra := range [][]string{{"--ep", "3"}, {"--ep", "2", "--num-speculative-tokens", "2"}, {"--tp", "2"}, {"--tp", "2", "--ep", "2"},
		{"--tp", "2", "--num-speculative-tokens", "2"}, {"--ep", "3", "--ep-dispatch", "all-to-all"}, {"--ep", "2", "--ep-dispatch", "all-to-all", "--num-speculative-tokens", "2"},
		{"--tp", "2", "--ep", "2", "--ep-dispatch", "all-to-all"}, {"--tp", "2", "--ep", "2", "--ep-dispatch", "all-to-all", "--tp-procs"}} {
		gpu, errOut, err := runGenerate(t, append(append(args, "--device", "cuda-emu"), extra...)...)
		if err != nil {
			t.Fatalf("--device cuda-emu %s: %v\n%s", strings.Join(extra, " "), err, errOut)
		}
		if tokensLine(gpu) == "" || tokensLine(gpu) != tokensLine(cpu) {
			t.Errorf("--device cuda-emu %s: %q, CPU %q", strings.Join(extra, " "), tokensLine(gpu), tokensLine(cpu))
		}
		if n := os.Getenv("RESIN_EMU_DEVICES"); n != "3" {
			t.Errorf("--device cuda-emu %s: the emulator shows %q GPUs, want 3 (openLayoutGPU set it for --ep 3: the GPU layout ran)", strings.Join(extra, " "), n)
		}
	}
	// The all-to-all dispatch with --tp runs with --ep equal: the same ranks split both ways.
	for _, c := range []struct {
		extra []string
		want  string
	}{{[]string{"--tp", "2", "--ep-dispatch", "all-to-all"}, "needs --ep 2 or more"}, {[]string{"--tp", "2", "--ep", "4", "--ep-dispatch", "all-to-all"}, "use --ep-dispatch gather"}} {
		if _, _, err := runGenerate(t, append(append(args, "--device", "cuda-emu"), c.extra...)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--device cuda-emu %s: %v, want a refusal saying %q", strings.Join(c.extra, " "), err, c.want)
		}
	}
}

// TestGenerateLayoutProcsOnTheEmulatedDevice: the MoE models' GPU layouts with
// --tp-procs (rank 1 a worker process of this binary on its own emulated GPU: the NCCL id
// and rank 0's pool geometry over the shared-memory control communicator,
// gpurunner.JoinGroup; the emulated NCCL's ranks meeting across the processes) print the
// in-process layout's tokens and write its --logits-out bit for bit: deepseek-v4-flash
// --ep 2, --tp 2, --tp 2 --ep 2 and --ep 2 with 2 MTP drafts a step, glm-5-flash --ep 2
// and --tp 2 with 2 drafts; no worker is left after.
func TestGenerateLayoutProcsOnTheEmulatedDevice(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	out := t.TempDir()
	run := func(model string, extra ...string) (string, []float32) {
		path := filepath.Join(out, model+strings.Join(extra, ""), "l.safetensors")
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		cfg := filepath.Join("..", "..", "models", model, "config.json")
		args := append([]string{"--model", model, "--random-weights", cfg, "--prompt-ids", "1,2,3,4,5", "--max-tokens", "6",
			"--device", "cuda-emu", "--logits-out", path}, extra...)
		got, errOut, err := runGenerate(t, args...)
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", model, strings.Join(extra, " "), err, errOut)
		}
		lg, _ := readLogits(t, path)
		return tokensLine(got), lg
	}
	for _, c := range []struct {
		model  string
		layout []string
	}{
		{"deepseek-v4-flash", []string{"--ep", "2"}},
		{"deepseek-v4-flash", []string{"--tp", "2"}},
		{"deepseek-v4-flash", []string{"--tp", "2", "--ep", "2"}},
		{"deepseek-v4-flash", []string{"--ep", "2", "--num-speculative-tokens", "2"}},
		{"glm-5-flash", []string{"--ep", "2"}},
		{"glm-5-flash", []string{"--tp", "2", "--num-speculative-tokens", "2"}},
		{"deepseek-v4-flash", []string{"--ep", "2", "--ep-dispatch", "all-to-all"}}, // the rows' sends across the processes
		{"glm-5-flash", []string{"--ep", "2", "--ep-dispatch", "all-to-all"}},
	} {
		what := c.model + " " + strings.Join(c.layout, " ")
		wantToks, want := run(c.model, c.layout...)
		gotToks, got := run(c.model, append(c.layout, "--tp-procs")...)
		if gotToks == "" || gotToks != wantToks {
			t.Errorf("%s --tp-procs: %q, in-process %q", what, gotToks, wantToks)
		}
		if len(got) != len(want) {
			t.Fatalf("%s --tp-procs: %d logits, in-process %d", what, len(got), len(want))
		}
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s --tp-procs: logit %d = %g, in-process %g", what, i, got[i], want[i])
			}
		}
	}
	if pids := childWorkers(t); len(pids) > 0 {
		t.Errorf("worker processes %v left after --tp-procs", pids)
	}
}

// TestGenerateLayoutGPUNodes: deepseek-v4-flash's GPU layout --ep 2 over two "nodes" (this
// process node 0, a child of this binary node 1 with torchrun's environment) meeting over
// TCP at --dist-init-addr, rank 0 handing out the NCCL id there (gpurunner.JoinGroup; the
// emulated NCCL meets the ranks in this host's shared memory), prints the in-process
// layout's tokens and writes its --logits-out bit for bit; and --ep 2 on one node (both
// ranks of this process joining over the rendezvous) too, and --ep 2 --ep-dispatch
// all-to-all over two nodes against the in-process all-to-all layout, and --tp 2 --ep 2 by
// all-to-all too. Node 1 ends when node 0 stops it.
func TestGenerateLayoutGPUNodes(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	cfg := filepath.Join("..", "..", "models", "deepseek-v4-flash", "config.json")
	out := t.TempDir()
	path := func(name string) string { return filepath.Join(out, name, "l.safetensors") }
	args := func(name string) []string {
		if err := os.MkdirAll(filepath.Dir(path(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		return []string{"--model", "deepseek-v4-flash", "--random-weights", cfg, "--device", "cuda-emu", "--prompt-ids", "1,2,3,4,5",
			"--max-tokens", "6", "--ep", "2", "--logits-out", path(name)}
	}
	want, errOut, err := runGenerate(t, args("in-process")...)
	if err != nil {
		t.Fatalf("in-process: %v\n%s", err, errOut)
	}
	wantLg, _ := readLogits(t, path("in-process"))
	same := func(what, got string) {
		t.Helper()
		if tokensLine(got) == "" || tokensLine(got) != tokensLine(want) {
			t.Fatalf("%s %q, in-process %q", what, tokensLine(got), tokensLine(want))
		}
		lg, _ := readLogits(t, path(what))
		if len(lg) != len(wantLg) {
			t.Fatalf("%s: %d logits, in-process %d", what, len(lg), len(wantLg))
		}
		for i := range wantLg {
			if math.Float32bits(lg[i]) != math.Float32bits(wantLg[i]) {
				t.Fatalf("%s: logit %d = %g, in-process %g", what, i, lg[i], wantLg[i])
			}
		}
	}
	addr := rendezvousAddr(t)
	host, port, _ := net.SplitHostPort(addr)
	node1 := args("node1")
	kill, wait := startNode(t, node1[:len(node1)-2], "MASTER_ADDR="+host, "MASTER_PORT="+port, "RANK=1", "WORLD_SIZE=2")
	got, errOut, err := runGenerate(t, append([]string{"--nnodes", "2", "--node-rank", "0", "--dist-init-addr", addr, "--dist-timeout", "2m"}, args("two-nodes")...)...)
	if err != nil {
		kill()
		t.Fatalf("node 0: %v (%s)", err, errOut)
	}
	wait()
	same("two-nodes", got)
	got, errOut, err = runGenerate(t, append([]string{"--nnodes", "1", "--dist-init-addr", rendezvousAddr(t), "--dist-timeout", "2m"}, args("one-node")...)...)
	if err != nil {
		t.Fatalf("one node: %v (%s)", err, errOut)
	}
	same("one-node", got)
	// The all-to-all dispatch over the two nodes (each rank's share of the rows sent over
	// the emulated NCCL's sends and receives across the processes): the in-process
	// all-to-all layout's tokens and logits bit for bit.
	a2a := func(name string) []string { return append(args(name), "--ep-dispatch", "all-to-all") }
	if want, errOut, err = runGenerate(t, a2a("in-process-a2a")...); err != nil {
		t.Fatalf("in-process, all-to-all: %v\n%s", err, errOut)
	}
	wantLg, _ = readLogits(t, path("in-process-a2a"))
	addr = rendezvousAddr(t)
	host, port, _ = net.SplitHostPort(addr)
	node1 = args("node1-a2a")
	kill, wait = startNode(t, append(node1[:len(node1)-2], "--ep-dispatch", "all-to-all"), "MASTER_ADDR="+host, "MASTER_PORT="+port, "RANK=1", "WORLD_SIZE=2")
	got, errOut, err = runGenerate(t, append([]string{"--nnodes", "2", "--node-rank", "0", "--dist-init-addr", addr, "--dist-timeout", "2m"}, a2a("two-nodes-a2a")...)...)
	if err != nil {
		kill()
		t.Fatalf("node 0, all-to-all: %v (%s)", err, errOut)
	}
	wait()
	same("two-nodes-a2a", got)
	// TP × EP by all-to-all over the two nodes: the in-process layout's logits bit for bit.
	tpA2A := []string{"--model", "deepseek-v4-flash", "--random-weights", cfg, "--device", "cuda-emu", "--prompt-ids", "1,2,3,4,5",
		"--max-tokens", "6", "--tp", "2", "--ep", "2", "--ep-dispatch", "all-to-all"}
	inLg := filepath.Join(out, "tp-a2a.safetensors")
	inProc, errOut, err := runGenerate(t, append(slices.Clone(tpA2A), "--logits-out", inLg)...)
	if err != nil {
		t.Fatalf("in-process --tp 2 --ep 2 all-to-all: %v\n%s", err, errOut)
	}
	got, lg := generateOverTwoNodes(t, tpA2A, nil)
	if wantB, err := os.ReadFile(inLg); err != nil || tokensLine(got) != tokensLine(inProc) || !bytes.Equal(lg, wantB) {
		t.Errorf("--tp 2 --ep 2 all-to-all over two nodes: %q, in-process %q; logits equal %v (%v)", tokensLine(got), tokensLine(inProc), bytes.Equal(lg, wantB), err)
	}
}

// TestGenerateDPAttentionOnTheEmulatedDevice: generate --model M --device cuda-emu --dp 2
// --dp-attention, for both MoE models, runs two dp ranks on two emulated GPUs (the routed
// experts split over them, exchanged over the emulated NCCL; the one request on rank 0,
// rank 1 idling every step through the MoE collectives): the CPU's greedy tokens and
// --logits-out within 1e-5, by either exchange (all-gather and reduce-scatter, or
// all-to-all: each row to its experts' ranks alone), and the same with --dp-procs (rank 1
// a worker process on its emulated GPU, the NCCL id over the dp group's shared memory,
// the emulated NCCL's collectives, sends and receives meeting across the processes),
// leaving no worker behind; the gather exchange's decode steps replay CUDA graphs;
// the ranks draft 2 tokens a step with the MTP head on the device (in-process and with
// --dp-procs) and print the CPU's tokens. What the GPU's DP-attention does not run is
// refused by name: llama.
func TestGenerateDPAttentionOnTheEmulatedDevice(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	for _, model := range []string{"deepseek-v4-flash", "glm-5-flash"} {
		cfg := filepath.Join("..", "..", "models", model, "config.json")
		args := []string{"--model", model, "--random-weights", cfg, "--prompt-ids", "1,2,3,4,5", "--max-tokens", "6", "--ignore-eos"}
		cpuLg := filepath.Join(t.TempDir(), "cpu.safetensors")
		cpu, errOut, err := runGenerate(t, append(args, "--logits-out", cpuLg)...)
		if err != nil {
			t.Fatalf("%s on the CPU: %v\n%s", model, err, errOut)
		}
		wantLg, wantShape := readLogits(t, cpuLg)
		for _, procs := range []string{"", "--dp-procs"} {
			for _, dispatch := range []string{"gather", "all-to-all"} {
				gpuLg := filepath.Join(t.TempDir(), "gpu.safetensors")
				a := append(slices.Clone(args), "--device", "cuda-emu", "--dp", "2", "--dp-attention", "--ep-dispatch", dispatch, "--logits-out", gpuLg)
				if procs != "" {
					a = append(a, procs)
				}
				what := fmt.Sprintf("%s --device cuda-emu --dp 2 --dp-attention --ep-dispatch %s %s", model, dispatch, procs)
				gpu, errOut, err := runGenerate(t, a...)
				if err != nil {
					t.Fatalf("%s: %v\n%s", what, err, errOut)
				}
				if tokensLine(gpu) == "" || tokensLine(gpu) != tokensLine(cpu) {
					t.Errorf("%s: %q, CPU %q", what, tokensLine(gpu), tokensLine(cpu))
				}
				lg, shape := readLogits(t, gpuLg)
				logitsClose(t, what, lg, shape, wantLg, wantShape)
				// The gather exchange's decode steps replay CUDA graphs unless --cuda-eager;
				// the all-to-all one's run eagerly.
				steps := map[string]string{"gather": "), decode graphs: ", "all-to-all": "), eager steps: "}[dispatch]
				if !strings.Contains(errOut, steps) {
					t.Errorf("%s: the log does not say %q:\n%s", what, steps, errOut)
				}
			}
		}
		if pids := childWorkers(t); len(pids) > 0 {
			t.Errorf("worker processes %v left after --dp-procs", pids)
		}
		// Every rank drafts with its MTP head on the device (DPDraft): the greedy tokens are
		// the CPU's without drafts, and the drafts proposed and accepted one GPU's.
		oneGPU, errOut, err := runGenerate(t, append(slices.Clone(args), "--device", "cuda-emu", "--num-speculative-tokens", "2")...)
		if err != nil {
			t.Fatalf("%s --device cuda-emu --num-speculative-tokens 2: %v\n%s", model, err, errOut)
		}
		spec := func(out string) string {
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, "speculative:") {
					return l
				}
			}
			return ""
		}
		for _, extra := range [][]string{{"--num-speculative-tokens", "2"}, {"--num-speculative-tokens", "2", "--dp-procs"}} {
			a := append(append(slices.Clone(args), "--device", "cuda-emu", "--dp", "2", "--dp-attention"), extra...)
			gpu, errOut, err := runGenerate(t, a...)
			if err != nil {
				t.Fatalf("%s --dp 2 --dp-attention %v on the device: %v\n%s", model, extra, err, errOut)
			}
			if tokensLine(gpu) == "" || tokensLine(gpu) != tokensLine(cpu) {
				t.Errorf("%s --dp 2 --dp-attention %v on the device: %q, CPU %q", model, extra, tokensLine(gpu), tokensLine(cpu))
			}
			if got, want := spec(gpu), spec(oneGPU); !strings.Contains(want, "drafts proposed") || got != want {
				t.Errorf("%s --dp 2 --dp-attention %v on the device: %q, one GPU %q", model, extra, got, want)
			}
		}
	}
	if _, _, err := runGenerate(t, "--model", "llama", "--random-weights", filepath.Join("..", "..", "models", "llama", "config.json"), "--prompt-ids", "1,2",
		"--max-tokens", "2", "--device", "cuda-emu", "--dp", "2", "--dp-attention"); err == nil || !strings.Contains(err.Error(), "covers deepseek-v4-flash and glm-5-flash only") {
		t.Errorf("llama --dp 2 --dp-attention on the device: %v", err)
	}
}

// TestDPAttentionGPUGraphBuckets: --dp 2 --dp-attention on the emulated device hands the
// dp.Group the ranks' decode graph buckets (it pads all-decode steps to them, so the ranks
// can replay graphs) under the gather exchange, in-process and with --dp-procs, and none
// under the all-to-all one or --cuda-eager (every step eager: padding would buy nothing).
func TestDPAttentionGPUGraphBuckets(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	m, err := models.Lookup("glm-5-flash")
	if err != nil {
		t.Fatal(err)
	}
	dir := configDir(t, filepath.Join("..", "..", "models", "glm-5-flash", "config.json"))
	for _, c := range []struct {
		dispatch     string
		eager, procs bool
		graphs       bool
	}{{"gather", false, false, true}, {"gather", false, true, true}, {"all-to-all", false, false, false}, {"gather", true, false, false}} {
		f := &runtimeFlags{model: m.Name, cacheBytes: 8 << 20, dp: dpFlags{size: 2, attention: true, procs: c.procs, stepTimeout: time.Minute},
			tp: tpFlags{size: 1, ep: 1, dispatch: c.dispatch}, device: cli.DeviceFlags{Device: cli.DeviceCUDAEmu, Eager: c.eager, Log: io.Discard}}
		r0, _, ranks, err := f.openDP(m, dir)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if b := ranks.Group.GraphBuckets(); (len(b) > 0) != c.graphs {
			t.Errorf("%+v: the group pads to %v, want graph buckets %v", c, b, c.graphs)
		}
		errs := []error{ranks.Group.Close()}
		if ranks.Close != nil {
			errs = append(errs, ranks.Close())
		}
		if s, ok := r0.(interface{ StopRanks() error }); ok { // --dp-procs: the workers
			errs = append(errs, s.StopRanks())
		}
		if err := errors.Join(errs...); err != nil {
			t.Errorf("%+v: close: %v", c, err)
		}
	}
}

// TestGenerateFreesTheGPU: a generate on the emulated device frees its device memory when
// it ends (core/cli closes the runner after stopping the engine), for one GPU, a GPU
// layout and prefill CP: device 0's free memory after each is what it was before (the
// runners' pools alone are 256 MiB, the emulator's device 8 GiB). Before, the runners
// were only stopped, and a program opening runners one after another ran out of memory.
func TestGenerateFreesTheGPU(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	dev, err := cudart.OpenDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	cfg := filepath.Join("..", "..", "models", "glm-5-flash", "config.json")
	for _, layout := range [][]string{nil, {"--ep", "2"}, {"--cp", "2"}, {"--model", "llama", "--random-weights", filepath.Join("testdata", "tiny-llama", "config.json")}} {
		before, _, err := dev.MemInfo()
		if err != nil {
			t.Fatal(err)
		}
		args := append([]string{"--model", "glm-5-flash", "--random-weights", cfg, "--device", "cuda-emu", "--prompt-ids", "1,2,3", "--max-tokens", "2"}, layout...)
		if _, errOut, err := runGenerate(t, args...); err != nil {
			t.Fatalf("%v: %v\n%s", layout, err, errOut)
		}
		after, _, err := dev.MemInfo()
		if err != nil {
			t.Fatal(err)
		}
		if after < before {
			t.Errorf("%v: device 0 has %d MiB free after generate, %d MiB before", layout, after>>20, before>>20)
		}
	}
}

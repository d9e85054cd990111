package main

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/dist/dp/dptest"
)

// TestGenerateDPAttentionNodes: generate --model glm-5-flash --dp 4 --dp-attention over
// two "nodes" (this process node 0 with dp ranks 0 and 1, a child of this binary node 1
// with ranks 2 and 3 and torchrun's environment) meeting over TCP at --dist-init-addr
// (dp.JoinTCP: rank 0's control pair with each rank, the data group the expert exchanges
// run on) prints one engine's tokens and --logits-out within 1e-5, by either exchange; the
// one request runs on rank 0, so ranks 1-3 idle every step through the MoE exchanges,
// across the nodes. Node 1 prints nothing and ends when node 0 stops it. So does --dp 2
// --dp-attention --tp 2 over two nodes, a dp rank's TP group on each. --dp 3 over two
// nodes, and --dp 2 --tp 3 over four, are refused naming the counts.
func TestGenerateDPAttentionNodes(t *testing.T) {
	cfg := filepath.Join("..", "..", "models", "glm-5-flash", "config.json")
	args := []string{"--model", "glm-5-flash", "--random-weights", cfg, "--prompt-ids", "1,2,3,4,5", "--max-tokens", "5", "--ignore-eos"}
	oneLg := filepath.Join(t.TempDir(), "one.safetensors")
	one, errOut, err := runGenerate(t, append(args, "--logits-out", oneLg)...)
	if err != nil {
		t.Fatalf("one engine: %v\n%s", err, errOut)
	}
	wantLg, wantShape := readLogits(t, oneLg)
	for _, dispatch := range []string{"gather", "all-to-all"} {
		got, lg := generateOverTwoNodes(t, args, []string{"--dp", "4", "--dp-attention", "--ep-dispatch", dispatch})
		if tokensLine(got) == "" || tokensLine(got) != tokensLine(one) {
			t.Errorf("--ep-dispatch %s: two nodes %q, one engine %q", dispatch, tokensLine(got), tokensLine(one))
		}
		g, shape := readLogitsBytes(t, lg)
		logitsClose(t, "--dp 4 --dp-attention over two nodes, --ep-dispatch "+dispatch, g, shape, wantLg, wantShape)
	}
	// Attention TP across the nodes: each node one dp rank's TP group (world ranks 0-1 and
	// 2-3), dp rank 1's plans crossing TCP to both its ranks.
	got, lg := generateOverTwoNodes(t, args, []string{"--dp", "2", "--dp-attention", "--tp", "2"})
	if tokensLine(got) == "" || tokensLine(got) != tokensLine(one) {
		t.Errorf("--dp 2 --dp-attention --tp 2: two nodes %q, one engine %q", tokensLine(got), tokensLine(one))
	}
	g, shape := readLogitsBytes(t, lg)
	logitsClose(t, "--dp 2 --dp-attention --tp 2 over two nodes", g, shape, wantLg, wantShape)
	_, _, err = runGenerate(t, append(append([]string{}, args...), "--dp", "2", "--dp-attention", "--tp", "3", "--nnodes", "4", "--dist-init-addr", rendezvousAddr(t))...)
	if err == nil || !strings.Contains(err.Error(), "--dp 2 --tp 3 over --nnodes 4: the 6 ranks must split evenly") {
		t.Errorf("--dp 2 --tp 3 over four nodes: %v, want a refusal naming the layout and counts", err)
	}
	_, _, err = runGenerate(t, append(append([]string{}, args...), "--dp", "3", "--dp-attention", "--nnodes", "2", "--dist-init-addr", rendezvousAddr(t))...)
	if err == nil || !strings.Contains(err.Error(), "--dp 3 over --nnodes 2") {
		t.Errorf("--dp 3 over two nodes: %v, want a refusal naming the counts", err)
	}
}

// TestGenerateDPAttentionGPUNodes is TestGenerateDPAttentionNodes on the emulated device
// with deepseek-v4-flash: --dp 2 --dp-attention --device cuda-emu over two nodes, one dp
// rank each on its GPU (JoinGPUDPRank over the TCP data group: rank 0's NCCL id; the
// emulated NCCL meets the ranks in this host's shared memory, as real NCCL's bootstrap
// would across hosts), prints the CPU's tokens and --logits-out within 1e-5.
func TestGenerateDPAttentionGPUNodes(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=1") {
		return
	}
	cfg := filepath.Join("..", "..", "models", "deepseek-v4-flash", "config.json")
	args := []string{"--model", "deepseek-v4-flash", "--random-weights", cfg, "--prompt-ids", "1,2,3,4,5", "--max-tokens", "5", "--ignore-eos"}
	cpuLg := filepath.Join(t.TempDir(), "cpu.safetensors")
	cpu, errOut, err := runGenerate(t, append(args, "--logits-out", cpuLg)...)
	if err != nil {
		t.Fatalf("on the CPU: %v\n%s", err, errOut)
	}
	wantLg, wantShape := readLogits(t, cpuLg)
	got, lg := generateOverTwoNodes(t, args, []string{"--dp", "2", "--dp-attention", "--device", "cuda-emu"})
	if tokensLine(got) == "" || tokensLine(got) != tokensLine(cpu) {
		t.Errorf("two GPU nodes %q, the CPU %q", tokensLine(got), tokensLine(cpu))
	}
	g, shape := readLogitsBytes(t, lg)
	logitsClose(t, "--dp 2 --dp-attention --device cuda-emu over two nodes", g, shape, wantLg, wantShape)
}

// TestDPNodesPortInUse: --dp 2 --dp-attention --dist-init-addr on a port another program
// listens on (it accepts and never answers) fails at once naming the port, as --tp's and
// --cp's do. Rank 0 could not listen, but dp rank 1's goroutine had reached the other
// listener, and rank 0 waited for it until --dist-timeout (10 minutes).
func TestDPNodesPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	cfg := filepath.Join("..", "..", "models", "glm-5-flash", "config.json")
	dptest.Within(t, time.Minute, "generate on a port in use", func() {
		_, _, err = runGenerate(t, "--model", "glm-5-flash", "--random-weights", cfg, "--prompt-ids", "1,2", "--max-tokens", "2",
			"--dp", "2", "--dp-attention", "--dist-init-addr", ln.Addr().String(), "--dist-timeout", "10m")
	})
	if err == nil || !strings.Contains(err.Error(), "the port is in use") {
		t.Errorf("generate on a port in use: %v, want the port named", err)
	}
}

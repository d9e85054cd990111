package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// rendezvousAddr is a free loopback HOST:PORT for --dist-init-addr.
func rendezvousAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startNode runs `resin generate args...` as a child process (this test binary, re-run
// as resin through RESIN_TEST_RESIN_ARGS) with env added; wait ends it and returns what
// it printed, failing the test if it failed.
func startNode(t *testing.T, args []string, env ...string) (kill func(), wait func() string) {
	t.Helper()
	childArgs, _ := json.Marshal(append([]string{"generate"}, args...))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(append(os.Environ(), "RESIN_TEST_RESIN_ARGS="+string(childArgs)), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	kill = func() { cmd.Process.Kill(); cmd.Wait(); cancel() }
	wait = func() string {
		defer cancel()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("node: %v\n%s", err, out.String())
		}
		return out.String()
	}
	return kill, wait
}

// TestGenerateNodesSeveralRanksEach: a node of a multi-node group runs its share of the
// ranks (--tp/--ep split evenly over --nnodes, as SGLang places a node's ranks), the first
// on the command's goroutine, the others on goroutines joining the rendezvous as ranks of
// their own. Before, a node held exactly one rank: --ep 4 over two nodes was refused.
//   - llama, --tp 2 on one node (both ranks local, over the TCP rendezvous): --tp 1's text;
//   - deepseek-v4-flash, --ep 4 over two nodes, node 1 a child process holding ranks 2
//     and 3: one rank's tokens, and node 1 prints nothing;
//   - ranks that do not split evenly over the nodes are refused, naming the counts.
func TestGenerateNodesSeveralRanksEach(t *testing.T) {
	llama := []string{"--model", "llama", "--random-weights", tinyLlama, "--cache-bytes", "4000000",
		"--max-tokens", "12", "--ignore-eos", "Once upon a time"}
	want, errOut, err := runGenerate(t, llama...)
	if err != nil {
		t.Fatalf("%v (%s)", err, errOut)
	}
	got, errOut, err := runGenerate(t, append([]string{"--tp", "2", "--nnodes", "1", "--dist-init-addr", rendezvousAddr(t), "--dist-timeout", "2m"}, llama...)...)
	if err != nil || got != want {
		t.Fatalf("--tp 2 on one node: %q %v (%s), --tp 1 %q", got, err, errOut, want)
	}

	v4 := []string{"--model", "deepseek-v4-flash", "--random-weights", "../../models/deepseek-v4-flash/config.json",
		"--prompt-ids", "1,2,3", "--max-tokens", "10", "--ignore-eos"}
	want, errOut, err = runGenerate(t, v4...)
	if err != nil {
		t.Fatalf("%v (%s)", err, errOut)
	}
	addr := rendezvousAddr(t)
	layout := []string{"--ep", "4", "--nnodes", "2", "--dist-init-addr", addr, "--dist-timeout", "2m"}
	kill, wait := startNode(t, append(append(layout, "--node-rank", "1"), v4...))
	got, errOut, err = runGenerate(t, append(append(layout, "--node-rank", "0"), v4...)...)
	if err != nil {
		kill()
		t.Fatalf("node 0: %v (%s)", err, errOut)
	}
	if out := wait(); out != "" {
		t.Errorf("node 1 printed %q; a worker node prints nothing", out)
	}
	if withoutTiming(got) != withoutTiming(want) {
		t.Fatalf("--ep 4 over two nodes printed %q, one rank %q", got, want)
	}

	_, _, err = runGenerate(t, append([]string{"--ep", "4", "--nnodes", "3", "--dist-init-addr", addr}, v4...)...)
	if err == nil || !strings.Contains(err.Error(), "the 4 ranks must split evenly over the nodes") {
		t.Fatalf("--ep 4 over 3 nodes: %v", err)
	}
}

// generateOverTwoNodes runs generate with args and layout over two "nodes" (this process node 0,
// a child of this binary node 1 with torchrun's environment) meeting over TCP at
// --dist-init-addr, and returns node 0's stdout and --logits-out file; node 1 must print
// no tokens and end when node 0 stops it.
func generateOverTwoNodes(t *testing.T, args, layout []string) (string, []byte) {
	t.Helper()
	addr := rendezvousAddr(t)
	host, port, _ := net.SplitHostPort(addr)
	kill, wait := startNode(t, append(append([]string{}, args...), layout...), "MASTER_ADDR="+host, "MASTER_PORT="+port, "RANK=1", "WORLD_SIZE=2")
	lg := filepath.Join(t.TempDir(), "nodes.safetensors")
	got, errOut, err := runGenerate(t, append(append(append([]string{"--nnodes", "2", "--node-rank", "0", "--dist-init-addr", addr, "--dist-timeout", "2m"}, args...), layout...), "--logits-out", lg)...)
	if err != nil {
		kill()
		t.Fatalf("%v over two nodes: node 0: %v (%s)", layout, err, errOut)
	}
	if out := wait(); strings.Contains(out, "tokens:") {
		t.Errorf("%v: node 1 printed tokens:\n%s", layout, out)
	}
	b, err := os.ReadFile(lg)
	if err != nil {
		t.Fatal(err)
	}
	return got, b
}

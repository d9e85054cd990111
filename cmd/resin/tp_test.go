package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// children lists this process's child processes (Linux's /proc task children files);
// empty where /proc is missing.
func children(t *testing.T) string {
	files, _ := filepath.Glob("/proc/self/task/*/children")
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.TrimSpace(string(b)) != "" {
			out = append(out, strings.TrimSpace(string(b)))
		}
	}
	return strings.Join(out, " ")
}

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

// TestGenerateTPProcs: with --tp-procs rank 1 is a worker process of this binary meeting
// rank 0 in shared memory; generate prints what --tp 1 prints, and the worker is stopped
// and reaped when generate returns (its exit status is checked in the runner's close).
func TestGenerateTPProcs(t *testing.T) {
	args := []string{"--model", "llama", "--random-weights", tinyLlama, "--cache-bytes", "4000000",
		"--max-tokens", "16", "--ignore-eos", "Once upon a time"}
	want, errOut, err := runGenerate(t, args...)
	if err != nil {
		t.Fatalf("%v (%s)", err, errOut)
	}
	// Only the children this generate starts count: an earlier test's process that is
	// still exiting is not this one's worker.
	before := strings.Fields(children(t))
	got, errOut, err := runGenerate(t, append([]string{"--tp", "2", "--tp-procs"}, args...)...)
	if err != nil {
		t.Fatalf("--tp 2 --tp-procs: %v (%s)", err, errOut)
	}
	if got != want {
		t.Fatalf("--tp 2 --tp-procs printed %q, --tp 1 %q", got, want)
	}
	var left []string
	for _, pid := range strings.Fields(children(t)) {
		if !slices.Contains(before, pid) {
			left = append(left, pid)
		}
	}
	if len(left) > 0 {
		t.Fatalf("generate returned with child processes left: %v", left)
	}
	if _, _, err := runGenerate(t, append([]string{"--tp-procs"}, args...)...); err == nil || !strings.Contains(err.Error(), "--tp-procs needs --tp 2") {
		t.Fatalf("--tp-procs alone: %v", err)
	}
	if _, _, err := runGenerate(t, append([]string{"--tp", "2", "--dist-timeout", "0s"}, args...)...); err == nil || !strings.Contains(err.Error(), "--dist-timeout 0s: want a positive duration") {
		t.Fatalf("--dist-timeout 0s: %v", err)
	}
}

// TestGenerateTPNodes: two "nodes" (this process as node 0, a child of this binary as
// node 1 given torchrun's environment instead of the flags) meeting over TCP at
// --dist-init-addr print what --tp 1 prints; node 1 ends when node 0 stops it. A
// mismatched layout is refused by name.
func TestGenerateTPNodes(t *testing.T) {
	args := []string{"--model", "llama", "--random-weights", tinyLlama, "--cache-bytes", "4000000",
		"--max-tokens", "16", "--ignore-eos", "Once upon a time"}
	want, errOut, err := runGenerate(t, args...)
	if err != nil {
		t.Fatalf("%v (%s)", err, errOut)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	host, port, _ := net.SplitHostPort(addr)
	childArgs, _ := json.Marshal(append([]string{"generate", "--tp", "2"}, args...))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), "RESIN_TEST_RESIN_ARGS="+string(childArgs),
		"MASTER_ADDR="+host, "MASTER_PORT="+port, "RANK=1", "WORLD_SIZE=2")
	var childOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &childOut, &childOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// --dist-timeout as the child's own deadline: a child that never joins (its port taken
	// by another test's listener meanwhile) fails node 0 in 2 minutes, not the default 10.
	got, errOut, err := runGenerate(t, append([]string{"--tp", "2", "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", addr, "--dist-timeout", "2m"}, args...)...)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("node 0: %v (%s)\nnode 1: %s", err, errOut, childOut.String())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("node 1: %v\n%s", err, childOut.String())
	}
	if got != want {
		t.Fatalf("two nodes printed %q, --tp 1 %q", got, want)
	}
	if childOut.Len() != 0 {
		t.Fatalf("node 1 printed %q; a worker node prints nothing", childOut.String())
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tp", "2", "--nnodes", "3", "--dist-init-addr", addr}, "the 2 ranks must split evenly over the nodes"},
		{[]string{"--tp", "2", "--nnodes", "2", "--node-rank", "2", "--dist-init-addr", addr}, "--node-rank 2"},
		{[]string{"--tp", "2", "--tp-procs", "--nnodes", "2", "--dist-init-addr", addr}, "exclusive"},
		{[]string{"--nnodes", "2"}, "need --dist-init-addr"},
	} {
		if _, _, err := runGenerate(t, append(c.args, args...)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%v: %v, want an error saying %q", c.args, err, c.want)
		}
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestGenerateTPNodesLWS: node 1 of a two-node --tp 2 group takes its place from
// Kubernetes LeaderWorkerSet's environment (LWS_LEADER_ADDRESS, LWS_GROUP_SIZE,
// LWS_WORKER_INDEX, the port in RESIN_DIST_PORT) instead of the flags, and the pair
// prints what --tp 1 prints; a malformed LWS variable is refused by name.
func TestGenerateTPNodesLWS(t *testing.T) {
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
		"LWS_LEADER_ADDRESS="+host, "LWS_GROUP_SIZE=2", "LWS_WORKER_INDEX=1", "RESIN_DIST_PORT="+port)
	var childOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &childOut, &childOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	got, errOut, err := runGenerate(t, append([]string{"--tp", "2", "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", addr, "--dist-timeout", "2m"}, args...)...)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("node 0: %v (%s)\nnode 1: %s", err, errOut, childOut.String())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("node 1: %v\n%s", err, childOut.String())
	}
	if got != want || childOut.Len() != 0 {
		t.Fatalf("two nodes printed %q (node 1 %q), --tp 1 %q", got, childOut.String(), want)
	}
	t.Setenv("LWS_LEADER_ADDRESS", host)
	t.Setenv("LWS_GROUP_SIZE", "two")
	t.Setenv("LWS_WORKER_INDEX", "1")
	if _, _, err := runGenerate(t, append([]string{"--tp", "2"}, args...)...); err == nil || !bytes.Contains([]byte(err.Error()), []byte(`LWS_GROUP_SIZE="two"`)) {
		t.Fatalf("a malformed LWS_GROUP_SIZE: %v", err)
	}
}

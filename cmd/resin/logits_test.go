package main

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/weights"
)

func generateWith(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newGenerateCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// TestGenerateLogitsOutTestRunner checks that the engine's test runner, which cannot
// capture logits, refuses --logits-out clearly and writes nothing.
func TestGenerateLogitsOutTestRunner(t *testing.T) {
	dir := t.TempDir()
	_, err := generateWith(t, "--max-tokens", "2", "--logits-out", filepath.Join(dir, "l.safetensors"), "hi")
	if err == nil || err.Error() != "--logits-out: runner test cannot capture logits" {
		t.Fatalf("error %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		t.Fatalf("files written: %v", entries)
	}
}

// TestGenerateLogitsOutModel runs --logits-out on a registered model (llama's runner
// captures logits through core/cpurunner): it writes one row per token it read.
func TestGenerateLogitsOutModel(t *testing.T) {
	const config = "testdata/tiny-llama/config.json"
	data, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := weights.ParseConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "l.safetensors")
	out, err := generateWith(t, "--model", "llama", "--random-weights", config, "--prompt-ids", "1,2,3",
		"--max-tokens", "4", "--max-batch-tokens", "2", "--logits-out", path)
	if err != nil {
		t.Fatal(err)
	}
	mt := regexp.MustCompile(`(?m)^tokens: \[([0-9 ]*)\]$`).FindStringSubmatch(out)
	if mt == nil {
		t.Fatalf("no tokens line in\n%s", out)
	}
	var gen []int64
	for _, f := range strings.Fields(mt[1]) {
		n, _ := strconv.ParseInt(f, 10, 64)
		gen = append(gen, n)
	}
	f, err := weights.OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ti, raw, err := f.ReadRaw("token_ids")
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for i := 0; i < ti.Elements(); i++ {
		ids = append(ids, int64(binary.LittleEndian.Uint64(raw[8*i:])))
	}
	if want := append([]int64{1, 2, 3}, gen[:len(gen)-1]...); !slices.Equal(ids, want) {
		t.Fatalf("token_ids %v, want %v", ids, want)
	}
	if li, _ := f.Info("logits"); li.DType != weights.F32 || !slices.Equal(li.Shape, []int{len(ids), cfg.VocabSize}) {
		t.Fatalf("logits %s %v", li.DType, li.Shape)
	}
}

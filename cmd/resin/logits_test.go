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

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/weights"
	"github.com/resin-llm/resin/models"
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

// TestGenerateLogitsOutModel runs --logits-out on a registered model: a runner that
// captures logits writes one row per token it read; one that cannot says so and writes
// nothing.
func TestGenerateLogitsOutModel(t *testing.T) {
	const config = "testdata/tiny-llama/config.json"
	dir := t.TempDir()
	path := filepath.Join(dir, "l.safetensors")
	out, err := generateWith(t, "--model", "llama", "--random-weights", config, "--prompt-ids", "1,2,3",
		"--max-tokens", "4", "--max-batch-tokens", "2", "--logits-out", path)

	// Whether llama's runner captures: open it the way --random-weights does.
	mdir := t.TempDir()
	data, rerr := os.ReadFile(config)
	if rerr != nil {
		t.Fatal(rerr)
	}
	os.WriteFile(filepath.Join(mdir, "config.json"), data, 0o644)
	m, lerr := models.Lookup("llama")
	if lerr != nil {
		t.Fatal(lerr)
	}
	r, _, oerr := m.Open(mdir, 4<<20)
	if oerr != nil {
		t.Fatal(oerr)
	}
	if _, ok := r.(cpurunner.LogitsCapturer); !ok {
		if err == nil || err.Error() != "--logits-out: runner llama cannot capture logits" {
			t.Fatalf("error %v, want that llama cannot capture logits", err)
		}
		if _, serr := os.Stat(path); !os.IsNotExist(serr) {
			t.Fatalf("%s written: %v", path, serr)
		}
		return
	}
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
	if li, _ := f.Info("logits"); li.DType != weights.F32 || !slices.Equal(li.Shape, []int{len(ids), r.Info().VocabSize}) {
		t.Fatalf("logits %s %v", li.DType, li.Shape)
	}
}

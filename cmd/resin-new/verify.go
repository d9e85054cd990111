package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
)

// verifyPlan says how --verify runs a scaffold: with its own config.json when the seeded
// random weights fit the machine, else with a scaled-down config of the same architecture
// (same model_type, GQA ratio, biases, q/k norm, tied head, window and rope settings).
type verifyPlan struct {
	weightBytes int64  // fp32 bytes of the config's random weights
	budget      int64  // the most --verify builds
	scaled      []byte // the config.json generate runs with; nil: the scaffold's own
	scaledDims  string
	// python is the interpreter that runs a Python runner's model (findRunnerPython); the
	// runtime's commands and tests get it as RESIN_PYTHON. Empty for a Go model.
	python string
}

func (p verifyPlan) describe() string {
	if p.python != "" {
		return p.describeWeights() + fmt.Sprintf("; the model runs in %s", p.python)
	}
	return p.describeWeights()
}

func (p verifyPlan) describeWeights() string {
	if p.scaled == nil {
		return fmt.Sprintf("build, test, and generate with the config's random weights (%s fp32, within %s)", gib(p.weightBytes), gib(p.budget))
	}
	return fmt.Sprintf("build, test, and generate with a scaled-down config of the same architecture (%s): the config's random weights would take %s fp32, more than %s",
		p.scaledDims, gib(p.weightBytes), gib(p.budget))
}

func gib(n int64) string { return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30)) }

// planVerify estimates the weights of the scaffold's config.json and, for the dense base,
// checks that the runtime's cache pool holds what --verify generates, before anything is
// written. A config too large for the machine is verified scaled down: the dense base
// shrinks its dimensions; a base with its own config.json (ownConfig) uses that one, its
// demo config of the same architecture.
func planVerify(a *Answers, b *Base, cfgJSON, ownConfig []byte) (verifyPlan, error) {
	if b.fileConfig() {
		var raw map[string]json.RawMessage
		if err := json.Unmarshal(cfgJSON, &raw); err != nil {
			return verifyPlan{}, fmt.Errorf("config.json: %w", err)
		}
		p := verifyPlan{weightBytes: 4 * genericParams(raw), budget: verifyBudget()}
		if p.weightBytes > p.budget {
			p.scaled, p.scaledDims = ownConfig, "the base's demo config.json"
		}
		return p, nil
	}
	c, err := weights.ParseConfig(cfgJSON)
	if err != nil {
		return verifyPlan{}, fmt.Errorf("config.json: %w", err)
	}
	p := verifyPlan{weightBytes: 4 * denseParams(c), budget: verifyBudget()}
	layers, kvHeads, headDim := c.NumHiddenLayers, c.NumKeyValueHeads, c.HeadDim
	if p.weightBytes > p.budget {
		if p.scaled, p.scaledDims, err = scaleConfig(cfgJSON, c); err != nil {
			return verifyPlan{}, err
		}
		layers, kvHeads, headDim = 2, 2, 32
	}
	// The dense runtime's cache: one full-attention group in float32, 256 MiB by default.
	g := kvslab.GroupSpec{Name: "kv", Kind: kvslab.Full, Layers: layers, BytesPerToken: 2 * kvHeads * headDim * 4, PageTokens: a.Model.PageTokens}
	if _, err := kvslab.Size(kvslab.Config{Groups: []kvslab.GroupSpec{g}}, 256<<20, 1); err != nil {
		return verifyPlan{}, fmt.Errorf("model.page_tokens %d: the runtime's default 256 MiB cache cannot hold one sequence (%v)", a.Model.PageTokens, err)
	}
	return p, nil
}

// genericParams estimates the parameters of a decoder config of any family from the keys
// HF configs share: embeddings and head, four hidden² attention projections per layer, and
// the MLP: routed experts (n_routed_experts, num_local_experts or num_experts, of
// moe_intermediate_size) plus shared experts, or a dense MLP of intermediate_size. An
// estimate: it decides whether --verify can build the config's random weights.
func genericParams(raw map[string]json.RawMessage) int64 {
	num := func(keys ...string) int64 {
		for _, k := range keys {
			if v, ok := raw[k]; ok {
				if n, err := strconv.ParseInt(string(v), 10, 64); err == nil {
					return n
				}
			}
		}
		return 0
	}
	h, v := num("hidden_size"), num("vocab_size")
	mlp := 3 * h * num("intermediate_size")
	if e := num("n_routed_experts", "num_local_experts", "num_experts"); e > 0 {
		w := num("moe_intermediate_size", "intermediate_size")
		mlp = (e + num("n_shared_experts", "num_shared_experts")) * 3 * h * w
	}
	n := v*h + num("num_hidden_layers")*(4*h*h+mlp)
	if string(raw["tie_word_embeddings"]) != "true" {
		n += v * h
	}
	return n
}

// denseParams counts the parameters of a dense decoder config.
func denseParams(c *weights.Config) int64 {
	h, v, i := int64(c.HiddenSize), int64(c.VocabSize), int64(c.IntermediateSize)
	q, kv := int64(c.NumAttentionHeads*c.HeadDim), int64(c.NumKeyValueHeads*c.HeadDim)
	perLayer := h*q + 2*h*kv + q*h + 3*h*i + 2*h
	n := v*h + int64(c.NumHiddenLayers)*perLayer + h
	if !c.TieWordEmbeddings {
		n += v * h
	}
	return n
}

// verifyBudget is a quarter of the memory available now, at most 4 GiB (2 GiB when
// /proc/meminfo cannot be read).
func verifyBudget() int64 {
	if avail, ok := weights.AvailableMemory(); ok {
		return min(avail/4, 4<<30)
	}
	return 2 << 30
}

// scaleConfig shrinks a config.json's dimensions and keeps every other field.
func scaleConfig(data []byte, c *weights.Config) ([]byte, string, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, "", fmt.Errorf("config.json: %w", err)
	}
	group := max(c.NumAttentionHeads/max(c.NumKeyValueHeads, 1), 1)
	dims := map[string]int{
		"hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 2,
		"num_key_value_heads": 2, "num_attention_heads": 2 * min(group, 4), "head_dim": 32,
		"vocab_size": min(c.VocabSize, 1024),
	}
	for k, v := range dims {
		m[k] = json.RawMessage(strconv.Itoa(v))
	}
	out, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, "", err
	}
	return out, fmt.Sprintf("hidden 128, 2 layers, %d heads / 2 kv heads of 32, vocab %d", dims["num_attention_heads"], dims["vocab_size"]), nil
}

// ErrVerifyInterrupted reports that an interrupt (SIGINT, SIGTERM) stopped --verify after
// the scaffold was written; resin-new exits 130 for it.
var ErrVerifyInterrupted = errors.New("verify interrupted")

// verify builds a fresh scaffold, runs its tests and generates a few tokens with random
// weights, streaming each command's output to w.
func verify(w io.Writer, root string, a *Answers, p verifyPlan) error {
	fmt.Fprintf(w, "verify: %s\n", p.describe())
	gen := []string{"go", "run", "./cmd/" + a.Name, "generate", "--prompt-ids", "1,2,3,4", "--max-tokens", "8"}
	if p.scaled != nil {
		dir, err := os.MkdirTemp("", "resin-verify-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if err := os.WriteFile(filepath.Join(dir, "config.json"), p.scaled, 0o644); err != nil {
			return err
		}
		gen = append(gen, "--model", dir)
	}
	steps := [][]string{
		{"go", "build", "./..."},
		{"go", "test", "-count=1", "./..."},
		gen,
	}
	env := append(os.Environ(), "GOWORK=off")
	if p.python != "" {
		env = append(env, "RESIN_PYTHON="+p.python)
		fmt.Fprintf(w, "verify: RESIN_PYTHON=%s\n", p.python)
	}
	// The scaffold is complete before verify starts: an interrupt stops the step (its
	// process group: go test's test binary too) and says so, rather than dying silently.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	for _, s := range steps {
		fmt.Fprintf(w, "verify: %s\n", strings.Join(s, " "))
		cmd := exec.CommandContext(ctx, s[0], s[1:]...)
		cmd.Dir = root
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = w, w
		killGroupOnCancel(cmd)
		cmd.WaitDelay = 5 * time.Second
		if err := cmd.Run(); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("%w during `%s`: the scaffold in %s is complete (it was written before verify began); to verify it, run `go build ./... && go test -count=1 ./...` there, or `resin-new check %s`",
					ErrVerifyInterrupted, strings.Join(s, " "), root, root)
			}
			return fmt.Errorf("verify %s: %s: %w", root, strings.Join(s, " "), err)
		}
	}
	fmt.Fprintf(w, "verify: %s builds, passes its tests and generates\n", a.Name)
	return nil
}

// findRunnerPython returns the interpreter that runs a Python runner's model: $RESIN_PYTHON,
// else the checkout's runner venv (.cache/runner-venv, made by
// .ci/setup.d/40-python-runner.sh), else python3 on PATH. It must import numpy and
// resin_runner; the error names the interpreters tried and what to install.
func findRunnerPython(coreDir string) (string, error) {
	var tried []string
	try := func(py string) (string, bool) {
		abs, err := exec.LookPath(py)
		if err != nil {
			tried = append(tried, py+": not found")
			return "", false
		}
		if abs, err = filepath.Abs(abs); err != nil {
			return "", false
		}
		out, err := exec.Command(abs, "-c", "import sys, numpy, resin_runner; assert sys.version_info >= (3, 11), 'Python >= 3.11 needed, this is ' + sys.version.split()[0]").CombinedOutput()
		if err != nil {
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			tried = append(tried, fmt.Sprintf("%s: %s", py, lines[len(lines)-1]))
			return "", false
		}
		return abs, true
	}
	if py := os.Getenv("RESIN_PYTHON"); py != "" {
		if abs, ok := try(py); ok {
			return abs, nil
		}
		return "", fmt.Errorf("RESIN_PYTHON %s cannot run the Python runner (%s); install numpy and resin-runner into it: %s -m pip install numpy %s",
			py, strings.Join(tried, "; "), py, filepath.Join(coreDir, "python"))
	}
	if abs, ok := try(filepath.Join(coreDir, ".cache", "runner-venv", "bin", "python")); ok {
		return abs, nil
	}
	if abs, ok := try("python3"); ok {
		return abs, nil
	}
	return "", fmt.Errorf("no Python that imports numpy and resin_runner (tried %s); make one with .ci/setup.d/40-python-runner.sh, or `python3 -m venv .venv && .venv/bin/pip install numpy %s` and set RESIN_PYTHON=.venv/bin/python",
		strings.Join(tried, "; "), filepath.Join(coreDir, "python"))
}

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/resin-llm/resin/templates"
)

// TestBadInput checks that every kind of bad input is a clear error and writes nothing.
func TestBadInput(t *testing.T) {
	core := coreDir(t)
	cfg := func(name string) string { return filepath.Join(core, "testdata", "hf-configs", name) }
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"bad name", []string{"model", "Bad_Name"}, "invalid model name"},
		{"keyword name", []string{"model", "func"}, "reserved"},
		{"bad module", []string{"model", "demo", "--module", "github.com//x"}, "invalid module path"},
		{"module with space", []string{"model", "demo", "--module", "a b"}, "invalid module path"},
		{"no name", []string{"model"}, "resin-new model demo --out"},
		{"two names", []string{"model", "a", "b"}, "2 arguments given"},
		{"unknown base", []string{"model", "demo", "--base", "gpt2"}, `unknown base "gpt2"`},
		{"unknown base lists the Python bases", []string{"model", "demo", "--base", "gpt2"}, "with --runner python: python-runner"},
		{"unknown architecture", []string{"model", "demo", "--hf-config", cfg("gpt2.json")}, "GPT2LMHeadModel"},
		{"malformed config", []string{"model", "demo", "--hf-config", cfg("malformed.json")}, "malformed"},
		{"missing config", []string{"model", "demo", "--hf-config", cfg("nope.json")}, "no such file"},
		{"bad set key", []string{"model", "demo", "--set", "hidden=3"}, "unknown key"},
		{"bad set value", []string{"model", "demo", "--set", "hidden_size=big"}, "not an integer"},
		{"bad gqa", []string{"model", "demo", "--set", "num_key_value_heads=3"}, "multiple of"},
		{"bad dtype", []string{"model", "demo", "--set", "dtype=int4"}, "want bf16"},
		// NaN and Inf pass a "<= 0" check, and config.json would get a token JSON lacks.
		{"nan theta", []string{"model", "demo", "--set", "rope_theta=NaN"}, "finite"},
		{"inf eps", []string{"model", "demo", "--set", "rms_norm_eps=+Inf"}, "finite"},
		// The dense base reads sliding_window for mistral only; elsewhere it was ignored.
		{"window on llama", []string{"model", "demo", "--set", "sliding_window=8"}, "mistral"},
		// runner.go assigns the seed to a uint64: a negative one rendered Go that does not build.
		{"negative seed", []string{"model", "demo", "--set", "seed=-1"}, "seed"},
		// Quoted with Go's %q into config.json: a control character is not JSON.
		{"bad architecture", []string{"model", "demo", "--set", "architecture=Llama\x01"}, "architecture"},
		// With --hf-config the runtime reads the copied config.json: a dimension set on top of
		// it reached resin.toml only, and the model ran with the file's value.
		{"set on an hf config", []string{"model", "demo", "--hf-config", cfg("qwen3-tiny.json"), "--set", "num_key_value_heads=1"}, "edit"},
		{"no target", []string{"model", "demo"}, "--out DIR"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "out")
			args := c.args
			if c.name != "no target" {
				args = append(args, "--out", dir)
			}
			out, err := runCLI(t, templates.FS, args...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one containing %q\n%s", err, c.want, out)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Fatalf("files written despite the error: %v", err)
			}
		})
	}
	if _, err := runCLI(t, templates.FS, "model", "demo", "--hf-config", cfg("gpt2.json"), "--out", t.TempDir()); err == nil ||
		!strings.Contains(err.Error(), "LlamaForCausalLM") {
		t.Errorf("unknown architecture should list the supported ones: %v", err)
	}

	// A non-empty target that is not a scaffold is refused, with --force too, and is left
	// as it was.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "keep.txt"), []byte("mine"), 0o644)
	for _, force := range []bool{false, true} {
		args := []string{"model", "demo", "--out", dir, "--no-tidy"}
		if force {
			args = append(args, "--force")
		}
		if _, err := runCLI(t, templates.FS, args...); err == nil || !strings.Contains(err.Error(), "not a resin-new scaffold") || !strings.Contains(err.Error(), "keep.txt") {
			t.Fatalf("non-empty target (--force %v): err = %v", force, err)
		}
		if tree := readTree(t, dir); len(tree) != 1 {
			t.Fatalf("non-empty target got files: %v", keys(tree))
		}
	}
	// A scaffold takes --force; without it the error says what to run.
	dir = filepath.Join(t.TempDir(), "demo")
	if out, err := runCLI(t, templates.FS, "model", "demo", "--out", dir, "--no-tidy", "--link-core"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := runCLI(t, templates.FS, "model", "demo", "--out", dir, "--no-tidy", "--link-core"); err == nil || !strings.Contains(err.Error(), "resin-new update") || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("a scaffold without --force: err = %v", err)
	}
	if out, err := runCLI(t, templates.FS, "model", "demo", "--out", dir, "--no-tidy", "--link-core", "--force"); err != nil {
		t.Fatalf("--force over a scaffold: %v\n%s", err, out)
	}
}

func TestDryRunWritesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "demo")
	out, err := runCLI(t, templates.FS, "model", "demo", "--out", dir, "--dry-run")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"dry run", "runner.go", "kernels/add_rmsnorm.cu", "resin.toml", "go.mod"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output lacks %s:\n%s", want, out)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatal("dry run wrote the target")
	}
}

func TestFailedRenderWritesNothing(t *testing.T) {
	m := templateCopy(t)
	m["dense/README.md.tmpl"].Data = []byte("{{ .NoSuchAnswer }}\n")
	dir := filepath.Join(t.TempDir(), "demo")
	if _, err := runCLI(t, m, "model", "demo", "--out", dir); err == nil || !strings.Contains(err.Error(), "README.md.tmpl") {
		t.Fatalf("err = %v, want a render error naming the template", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatal("a failed render wrote files")
	}
	// Sprig's environment functions are not available to templates.
	m["dense/README.md.tmpl"].Data = []byte(`{{ env "HOME" }}`)
	if _, err := runCLI(t, m, "model", "demo", "--out", dir); err == nil || !strings.Contains(err.Error(), `"env" not defined`) {
		t.Fatalf("env in a template: err = %v", err)
	}
}

// TestInTree scaffolds a model inside a copy of the checkout's skeleton and checks that
// the registry edit is made once, however often it runs.
func TestInTree(t *testing.T) {
	fake := fakeCore(t)

	for i := 0; i < 2; i++ {
		args := []string{"model", "tiny-one", "--in-tree", "--core", fake}
		if i == 1 {
			args = append(args, "--force")
		}
		if out, err := runCLI(t, templates.FS, args...); err != nil {
			t.Fatalf("run %d: %v\n%s", i, err, out)
		}
		got, _ := os.ReadFile(filepath.Join(fake, "models", "registry.go"))
		s := string(got)
		if n := strings.Count(s, `"github.com/resin-llm/resin/models/tiny-one"`); n != 1 {
			t.Fatalf("run %d: import appears %d times:\n%s", i, n, s)
		}
		if n := strings.Count(s, `{Name: "tiny-one", Architectures: tinyone.Architectures, Open: tinyone.Open},`); n != 1 {
			t.Fatalf("run %d: entry appears %d times:\n%s", i, n, s)
		}
	}
	tree := readTree(t, filepath.Join(fake, "models", "tiny-one"))
	if _, ok := tree["go.mod"]; ok {
		t.Error("an in-tree model got its own go.mod")
	}
	if !strings.Contains(tree["runner.go"], "package tinyone") || !strings.Contains(tree["resin.toml"], `layout = "in-tree"`) {
		t.Error("in-tree model has the wrong package or layout")
	}
	if _, err := runCLI(t, templates.FS, "model", "x", "--in-tree", "--out", t.TempDir()); err == nil {
		t.Error("--in-tree with --out accepted")
	}
}

// TestGeneratedRuntimeBuildsAndTests scaffolds one standalone runtime into a temporary
// directory and runs --verify offline (GOPROXY=off: everything comes from the module cache
// that building this repository filled): go build, go test and a generate run.
func TestGeneratedRuntimeBuildsAndTests(t *testing.T) {
	shareScaffoldBuilds(t)
	if testing.Short() {
		t.Skip("builds and tests a whole generated runtime")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go tool on PATH")
	}
	dir := filepath.Join(t.TempDir(), "demo")
	out, err := runCLI(t, templates.FS, "model", "demo", "--out", dir, "--verify")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"ok  \texample.com/demo\t", "tokens: [", "finish: length", "builds, passes its tests and generates"} {
		if !strings.Contains(out, want) {
			t.Errorf("verify output lacks %q:\n%s", want, out)
		}
	}
}

// TestInTreeNameCollidingWithRegistryImport checks that a model whose package name is
// already taken by another import of models/registry.go (core/engine, or a model whose
// name differs only by hyphens) is refused before anything is written: inserting its
// import would leave a registry that no longer compiles.
func TestInTreeNameCollidingWithRegistryImport(t *testing.T) {
	fake := fakeCore(t)
	regPath := filepath.Join(fake, "models", "registry.go")

	if out, err := runCLI(t, templates.FS, "model", "tiny-one", "--in-tree", "--core", fake); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	before, _ := os.ReadFile(regPath)
	for _, name := range []string{"engine", "kvslab", "strings", "tinyone"} {
		_, err := runCLI(t, templates.FS, "model", name, "--in-tree", "--core", fake)
		if err == nil || !strings.Contains(err.Error(), "models/registry.go") {
			t.Errorf("%s: err = %v, want a collision with an import of models/registry.go", name, err)
		}
		if _, err := os.Stat(filepath.Join(fake, "models", name)); !os.IsNotExist(err) {
			t.Errorf("%s: files written despite the error", name)
		}
		if after, _ := os.ReadFile(regPath); string(after) != string(before) {
			t.Errorf("%s: registry changed despite the error:\n%s", name, after)
		}
	}
}

// TestGeneratedVariantsPassTheirTests scaffolds runtimes whose answers change config.json
// (q/k norm, biases, a tied head, a sliding window, one kv head) and runs their model
// tests offline: every answer --set accepts must give a runtime that passes its own tests.
func TestGeneratedVariantsPassTheirTests(t *testing.T) {
	shareScaffoldBuilds(t, "-mod=mod")
	if testing.Short() {
		t.Skip("builds and tests generated runtimes")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go tool on PATH")
	}
	for name, sets := range map[string][]string{
		"qwen3-bias-tied":    {"model_type=qwen3", "architecture=Qwen3ForCausalLM", "qk_norm=true", "attention_bias=true", "tie_word_embeddings=true"},
		"mistral-window-mqa": {"model_type=mistral", "architecture=MistralForCausalLM", "sliding_window=8", "num_key_value_heads=1"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "v")
			args := []string{"model", "variant", "--out", dir}
			for _, s := range sets {
				args = append(args, "--set", s)
			}
			if out, err := runCLI(t, templates.FS, args...); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			cmd := exec.Command("go", "test", "-count=1", ".")
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "GOWORK=off")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("go test in a runtime scaffolded with %v: %v\n%s", sets, err, out)
			}
		})
	}
}

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/resin-llm/resin/templates"
)

// TestPythonRunnerChoice checks how --runner python picks its base and what it records:
// the python-runner base, its variant presets under the dense names, --hf-config among the
// Python bases, runner = "python" in resin.toml (kept by update), the resin-runner package
// vendored beside the core; and that mixing a base of one kind with the other runner is a
// clear error that writes nothing.
func TestPythonRunnerChoice(t *testing.T) {
	core := coreDir(t)
	for _, c := range []struct {
		name            string
		args            []string
		base, modelType string
	}{
		{"default", nil, "python-runner", "llama"},
		{"short variant name", []string{"--base", "qwen3"}, "python-runner", "qwen3"},
		{"variant alias", []string{"--base", "python-mistral"}, "python-runner", "mistral"},
		{"hf config", []string{"--hf-config", filepath.Join(core, "testdata", "hf-configs", "qwen3-tiny.json")}, "python-runner", "qwen3"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "py")
			args := append([]string{"model", "py", "--runner", "python", "--out", dir, "--no-tidy"}, c.args...)
			if out, err := runCLI(t, templates.FS, args...); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			a, err := loadAnswers(dir)
			if err != nil {
				t.Fatal(err)
			}
			if a.Base != c.base || a.Runner != RunnerPython || a.Model.ModelType != c.modelType {
				t.Errorf("base %q runner %q model_type %q, want %q %q %q", a.Base, a.Runner, a.Model.ModelType, c.base, RunnerPython, c.modelType)
			}
			for _, f := range []string{"python/py_runner/model.py", "python.go", "cmd/py/main.go", VendorDir + "/python/resin_runner/runner.py", VendorDir + "/python/pyproject.toml"} {
				if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(f))); err != nil {
					t.Errorf("%s: %v", f, err)
				}
			}
		})
	}

	// In the checkout: registered like a Go model, without a vendored core.
	fake := fakeCore(t)
	if out, err := runCLI(t, templates.FS, "model", "py-in", "--runner", "python", "--in-tree", "--core", fake); err != nil {
		t.Fatalf("--in-tree: %v\n%s", err, out)
	}
	reg, _ := os.ReadFile(filepath.Join(fake, "models", "registry.go"))
	if !strings.Contains(string(reg), `{Name: "py-in", Architectures: pyin.Architectures, Open: pyin.Open},`) {
		t.Errorf("--in-tree --runner python: no registry entry:\n%s", reg)
	}
	tree := readTree(t, filepath.Join(fake, "models", "py-in"))
	if !strings.Contains(tree["runner.go"], "var Architectures = []string{\"LlamaForCausalLM\"}") || tree["python/pyin_runner/model.py"] == "" {
		t.Errorf("--in-tree --runner python: runner.go lacks Architectures or the Python package is missing (files: %v)", keys(tree))
	}

	// A Go scaffold records no runner and vendors no Python.
	dir := filepath.Join(t.TempDir(), "go")
	if out, err := runCLI(t, templates.FS, "model", "gomodel", "--out", dir, "--no-tidy"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if data, _ := os.ReadFile(filepath.Join(dir, AnswersFile)); strings.Contains(string(data), "runner") {
		t.Errorf("a Go scaffold's %s mentions a runner:\n%s", AnswersFile, data)
	}
	if _, err := os.Stat(filepath.Join(dir, VendorDir, "python")); !os.IsNotExist(err) {
		t.Errorf("a Go scaffold vendors the Python package: %v", err)
	}

	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown runner", []string{"--runner", "rust"}, `--runner "rust": want go`},
		{"go base, python runner", []string{"--runner", "python", "--base", "deepseek-v4"}, "--base deepseek-v4 runs its model in Go"},
		{"python base, go runner", []string{"--base", "python-runner"}, "pass --runner python"},
		{"unsupported architecture", []string{"--runner", "python", "--hf-config", filepath.Join(core, "testdata", "hf-configs", "gpt2.json")}, "with --runner python the bases are python-runner"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "out")
			out, err := runCLI(t, templates.FS, append([]string{"model", "x", "--out", dir, "--no-tidy"}, c.args...)...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one containing %q\n%s", err, c.want, out)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Fatalf("files written despite the error: %v", err)
			}
		})
	}
}

// TestPythonRunnerUpdate checks that update keeps a Python runner's answers (an update of
// an unchanged scaffold changes nothing) and refuses answers whose runner is not their
// base's.
func TestPythonRunnerUpdate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "py")
	if out, err := runCLI(t, templates.FS, "model", "py", "--runner", "python", "--out", dir, "--no-tidy"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	before := readTree(t, dir)
	if out, err := runCLI(t, templates.FS, "update", dir); err != nil {
		t.Fatalf("update: %v\n%s", err, out)
	}
	after := readTree(t, dir)
	for p, s := range before {
		if after[p] != s && !strings.HasPrefix(p, VendorDir+"/") {
			t.Errorf("update of an unchanged scaffold changed %s:\n%s", p, firstDiff(s, after[p]))
		}
	}
	if !strings.Contains(after[AnswersFile], `runner = "python"`) {
		t.Errorf("update dropped the runner:\n%s", after[AnswersFile])
	}

	path := filepath.Join(dir, AnswersFile)
	os.WriteFile(path, []byte(strings.Replace(after[AnswersFile], `runner = "python"`, `runner = "go"`, 1)), 0o644)
	if out, err := runCLI(t, templates.FS, "update", dir); err == nil || !strings.Contains(err.Error(), "base python-runner runs its model in python") {
		t.Errorf("update with runner go on the python base: err = %v\n%s", err, out)
	}
	os.WriteFile(path, []byte(strings.Replace(after[AnswersFile], `runner = "python"`, `runner = "rust"`, 1)), 0o644)
	if out, err := runCLI(t, templates.FS, "update", dir); err == nil || !strings.Contains(err.Error(), `runner "rust"`) {
		t.Errorf("update with runner rust: err = %v\n%s", err, out)
	}
}

// TestPythonVerifyNeedsPython checks that --verify of a Python runner, given an interpreter
// that cannot run it, says so, naming the interpreter and what to install, before anything
// is written.
func TestPythonVerifyNeedsPython(t *testing.T) {
	t.Setenv("RESIN_PYTHON", filepath.Join(t.TempDir(), "no-python"))
	dir := filepath.Join(t.TempDir(), "py")
	out, err := runCLI(t, templates.FS, "model", "py", "--runner", "python", "--out", dir, "--no-tidy", "--verify")
	if err == nil || !strings.Contains(err.Error(), "RESIN_PYTHON") || !strings.Contains(err.Error(), "pip install numpy") {
		t.Fatalf("err = %v, want one naming RESIN_PYTHON and what to install\n%s", err, out)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("files written despite the error: %v", err)
	}
	// A dry run says what the real one would refuse.
	out, err = runCLI(t, templates.FS, "model", "py", "--runner", "python", "--out", dir, "--dry-run", "--verify")
	if err != nil || !strings.Contains(out, "then verify: would refuse: RESIN_PYTHON") {
		t.Fatalf("dry run: err = %v, want the refusal in its output\n%s", err, out)
	}
}

// TestPythonRuntimeBuildsAndGenerates scaffolds a standalone runtime with --runner python
// and builds it; where an interpreter runs the model (RESIN_PYTHON, the checkout's
// .cache/runner-venv, python3), --verify also runs its tests (the Python package's, the
// conformance suite through the protocol, greedy against the naive forward) and generates
// through the Python runner. Without one, the runtime's Python tests must skip, saying why.
func TestPythonRuntimeBuildsAndGenerates(t *testing.T) {
	shareScaffoldBuilds(t)
	if testing.Short() {
		t.Skip("builds and tests a whole generated runtime")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go tool on PATH")
	}
	dir := filepath.Join(t.TempDir(), "pyrt")
	py, pyErr := findRunnerPython(coreDir(t))
	if pyErr != nil {
		if out, err := runCLI(t, templates.FS, "model", "pyrt", "--runner", "python", "--out", dir); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if out, err := runIn(dir, "go", "build", "./..."); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
		t.Setenv("RESIN_PYTHON", filepath.Join(t.TempDir(), "no-python"))
		out, err := runIn(dir, "go", "test", "-count=1", "-v", "-run", "TestEngineGreedy", ".")
		if err != nil || !strings.Contains(out, "--- SKIP: TestEngineGreedy") || !strings.Contains(out, "no Python interpreter that imports numpy and resin_runner") {
			t.Fatalf("without Python, TestEngineGreedy should skip saying why: %v\n%s", err, out)
		}
		t.Skipf("built; not generated: %v", pyErr)
	}
	t.Logf("Python: %s", py)
	out, err := runCLI(t, templates.FS, "model", "pyrt", "--runner", "python", "--out", dir, "--verify")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"the model runs in " + py, "ok  \texample.com/pyrt\t", "tokens: [", "finish: length", "builds, passes its tests and generates"} {
		if !strings.Contains(out, want) {
			t.Errorf("verify output lacks %q:\n%s", want, out)
		}
	}
	// The Go tests ran the Python ones, not skipped them.
	t.Setenv("RESIN_PYTHON", py)
	out, err = runIn(dir, "go", "test", "-count=1", "-v", "-run", "TestEngineGreedy|TestPythonPackage", ".")
	if err != nil || strings.Contains(out, "--- SKIP") || strings.Count(out, "--- PASS") != 2 {
		t.Errorf("TestEngineGreedy and TestPythonPackage should pass with %s: %v\n%s", py, err, out)
	}
}

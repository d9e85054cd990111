package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/resin-llm/resin/templates"
)

// TestRefusedBeforeWriting covers refusals an outside review found accepted: each is an error
// naming the problem, and nothing is written.
func TestRefusedBeforeWriting(t *testing.T) {
	core := coreDir(t)
	cfg := func(name string) string { return filepath.Join(core, "testdata", "hf-configs", name) }
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"mixtral on dense", []string{"--base", "dense", "--hf-config", cfg("mixtral-8x7b.json")}, []string{"MixtralForCausalLM", "num_local_experts", "num_experts_per_tok"}},
		{"phi3 on dense", []string{"--base", "dense", "--hf-config", cfg("phi3-mini.json")}, []string{"Phi3ForCausalLM", "sliding_window"}},
		{"mixtral by architecture", []string{"--hf-config", cfg("mixtral-8x7b.json")}, []string{"MixtralForCausalLM", "not supported"}},
		{"core module", []string{"--module", CoreModule}, []string{"core's own module"}},
		{"core subpackage module", []string{"--module", CoreModule + "/models/x"}, []string{"core's own module"}},
		{"huge page", []string{"--set", "page_tokens=1000000"}, []string{"page_tokens"}},
		{"page beyond the pool", []string{"--set", "page_tokens=1024", "--set", "num_hidden_layers=64", "--set", "num_key_value_heads=4", "--set", "num_attention_heads=4", "--set", "head_dim=256"}, []string{"page_tokens", "256 MiB"}},
		{"short context", []string{"--set", "max_position_embeddings=4"}, []string{"max_position_embeddings"}},
		{"bad core", []string{"--core", "/nonexistent"}, []string{"--core /nonexistent"}},
	} {
		for _, dry := range []bool{false, true} {
			t.Run(c.name, func(t *testing.T) {
				dir := filepath.Join(t.TempDir(), "out")
				args := append([]string{"model", "demo", "--out", dir, "--no-tidy"}, c.args...)
				if dry {
					args = append(args, "--dry-run", "--verify")
				}
				out, err := runCLI(t, templates.FS, args...)
				if err == nil {
					t.Fatalf("dry-run %v: accepted\n%s", dry, out)
				}
				for _, w := range c.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("dry-run %v: err = %v, want it to name %q", dry, err, w)
					}
				}
				if _, err := os.Stat(dir); !os.IsNotExist(err) {
					t.Fatal("files written despite the error")
				}
			})
		}
	}
	for _, name := range reservedNames {
		if _, err := validateName(name); err == nil || !strings.Contains(err.Error(), "directory") {
			t.Errorf("model name %q: err = %v", name, err)
		}
	}
}

// TestPresets: --base ALIAS without --hf-config starts from that family, not from Llama.
func TestPresets(t *testing.T) {
	for alias, want := range map[string][]string{
		"qwen3":   {`model_type = "qwen3"`, `architecture = "Qwen3ForCausalLM"`, "qk_norm = true"},
		"qwen2":   {`model_type = "qwen2"`, "attention_bias = true"},
		"mistral": {`model_type = "mistral"`, "sliding_window = 4096"},
		"dense":   {`model_type = "llama"`, `architecture = "LlamaForCausalLM"`},
	} {
		dir := filepath.Join(t.TempDir(), "p")
		if out, err := runCLI(t, templates.FS, "model", "p", "--base", alias, "--out", dir, "--no-tidy", "--link-core"); err != nil {
			t.Fatalf("%s: %v\n%s", alias, err, out)
		}
		toml, _ := os.ReadFile(filepath.Join(dir, AnswersFile))
		cfg, _ := os.ReadFile(filepath.Join(dir, "config.json"))
		for _, w := range want {
			if !strings.Contains(string(toml), w) {
				t.Errorf("--base %s: resin.toml lacks %s", alias, w)
			}
		}
		if !strings.Contains(string(cfg), strings.Split(want[0], `"`)[1]) {
			t.Errorf("--base %s: config.json is not that family:\n%s", alias, cfg)
		}
	}
}

// TestForceProtects: --force refuses the checkout and foreign modules, and keeps a named
// backup of every file it replaces with other content.
func TestForceProtects(t *testing.T) {
	core := coreDir(t)
	if _, err := runCLI(t, templates.FS, "model", "demo", "--out", core, "--force", "--dry-run"); err == nil || !strings.Contains(err.Error(), "Resin checkout") {
		t.Errorf("--out at the checkout: err = %v", err)
	}
	if _, err := runCLI(t, templates.FS, "model", "demo", "--out", filepath.Dir(core), "--force", "--dry-run"); err == nil || !strings.Contains(err.Error(), "Resin checkout") {
		t.Errorf("--out above the checkout: err = %v", err)
	}
	foreign := t.TempDir()
	os.WriteFile(filepath.Join(foreign, "go.mod"), []byte("module example.com/other\n"), 0o644)
	if _, err := runCLI(t, templates.FS, "model", "demo", "--out", foreign, "--force", "--no-tidy"); err == nil || !strings.Contains(err.Error(), "not a resin-new scaffold") {
		t.Errorf("foreign module: err = %v", err)
	}
	if tree := readTree(t, foreign); len(tree) != 1 {
		t.Errorf("foreign module got files: %v", keys(tree))
	}
	// Nor over any other directory with files in it (it was refused only with a go.mod).
	notes := t.TempDir()
	os.WriteFile(filepath.Join(notes, "notes.txt"), []byte("mine\n"), 0o644)
	if _, err := runCLI(t, templates.FS, "model", "demo", "--out", notes, "--force", "--no-tidy"); err == nil || !strings.Contains(err.Error(), "not a resin-new scaffold") || !strings.Contains(err.Error(), "notes.txt") {
		t.Errorf("a directory of other files: err = %v", err)
	}
	if tree := readTree(t, notes); len(tree) != 1 {
		t.Errorf("a directory of other files got files: %v", keys(tree))
	}
	// A repository that holds nothing but .git takes the scaffold.
	repo := t.TempDir()
	os.MkdirAll(filepath.Join(repo, ".git"), 0o755)
	if out, err := runCLI(t, templates.FS, "model", "demo", "--out", repo, "--force", "--no-tidy", "--link-core"); err != nil {
		t.Errorf("an empty git repository: %v\n%s", err, out)
	}

	dir := filepath.Join(t.TempDir(), "demo")
	if out, err := runCLI(t, templates.FS, "model", "demo", "--out", dir, "--no-tidy", "--link-core"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	mine := "package demo\n\n// my forward, hours of work\n"
	os.WriteFile(filepath.Join(dir, "forward.go"), []byte(mine), 0o644)
	out, err := runCLI(t, templates.FS, "model", "demo", "--out", dir, "--no-tidy", "--link-core", "--force")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, backupDir) {
		t.Fatalf("--force did not name the backup:\n%s", out)
	}
	var found bool
	filepath.WalkDir(filepath.Join(dir, filepath.FromSlash(backupDir)), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "forward.go" {
			b, _ := os.ReadFile(p)
			found = string(b) == mine
		}
		return nil
	})
	if !found {
		t.Fatal("the edited forward.go was not backed up")
	}
}

// TestUpdateUserOwned: a template change to a file that is yours arrives as a patch that
// applies, never as an edit; a file you deleted stays deleted, update after update.
func TestUpdateUserOwned(t *testing.T) {
	dir := scaffoldDemo(t)
	os.Remove(filepath.Join(dir, "kernels", "ref.go"))
	forward, _ := os.ReadFile(filepath.Join(dir, "forward.go"))
	for i := 0; i < 2; i++ {
		out, err := runCLI(t, newerTemplate(t), "update", dir)
		if err != nil {
			t.Fatalf("update %d: %v\n%s", i, err, out)
		}
		if _, err := os.Stat(filepath.Join(dir, "kernels", "ref.go")); !os.IsNotExist(err) {
			t.Fatalf("update %d recreated the deleted kernels/ref.go\n%s", i, out)
		}
		if i == 0 && (!strings.Contains(out, "deleted") || !strings.Contains(out, "patch")) {
			t.Errorf("update %d report lacks the deletion or the patch:\n%s", i, out)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "forward.go")); string(got) != string(forward) {
		t.Fatal("update changed user-owned forward.go")
	}
	patch := filepath.Join(dir, filepath.FromSlash(patchPath("forward.go")))
	if _, err := os.Stat("/usr/bin/patch"); err == nil {
		if out, err := runIn(dir, "patch", "-p1", "-i", patch); err != nil {
			t.Fatalf("the patch does not apply: %v\n%s", err, out)
		}
		if got, _ := os.ReadFile(filepath.Join(dir, "forward.go")); !strings.Contains(string(got), "// Model (v4) is a loaded model") {
			t.Fatal("the applied patch did not bring the template's change")
		}
	}
}

// TestAnswersValidated: resin.toml is checked whole before update touches anything.
func TestAnswersValidated(t *testing.T) {
	for _, c := range []struct{ old, new, want string }{
		{`layout = "standalone"`, `layout = "weird"`, `layout "weird"`},
		{`package = "demo"`, `package = "other"`, "does not follow"},
		{`import = "example.com/demo"`, `import = "example.com/x"`, "must equal module"},
		{`name = "demo"`, `name = "renamed"`, "does not follow"},
	} {
		dir := scaffoldDemo(t)
		before := readTree(t, dir)
		p := filepath.Join(dir, AnswersFile)
		b, _ := os.ReadFile(p)
		edited := strings.Replace(string(b), c.old, c.new, 1)
		os.WriteFile(p, []byte(edited), 0o644)
		before[AnswersFile] = edited
		if _, err := runCLI(t, newerTemplate(t), "update", dir); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", c.new, err, c.want)
		}
		if !sameTree(readTree(t, dir), before) {
			t.Errorf("%s: update changed the tree despite the error", c.new)
		}
	}
	// A consistent rename (name and package both) is refused too: the user's files keep the
	// old package.
	dir := scaffoldDemo(t)
	p := filepath.Join(dir, AnswersFile)
	b, _ := os.ReadFile(p)
	s := strings.NewReplacer(`name = "demo"`, `name = "renamed"`, `package = "demo"`, `package = "renamed"`).Replace(string(b))
	os.WriteFile(p, []byte(s), 0o644)
	if _, err := runCLI(t, newerTemplate(t), "update", dir); err == nil || !strings.Contains(err.Error(), "does not rename") {
		t.Errorf("rename: err = %v", err)
	}
}

// TestRebuildBase: a lost record is rebuilt from the embedded template at the recorded
// version, or from the checkout's git history when the template moved on.
func TestRebuildBase(t *testing.T) {
	dir := scaffoldDemo(t)
	rec := filepath.Join(dir, RecordFile)
	want, _ := os.ReadFile(rec)
	os.Remove(rec)
	if _, err := runCLI(t, templates.FS, "update", dir); err == nil || !strings.Contains(err.Error(), "--rebuild-base") {
		t.Fatalf("update without a record: err = %v, want it to point at --rebuild-base", err)
	}
	if out, err := runCLI(t, templates.FS, "update", "--rebuild-base", dir); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if got, _ := os.ReadFile(rec); string(got) != string(want) {
		t.Fatal("rebuilt record differs from the original")
	}

	// The embedded template is newer (v4) than the scaffold's (v3): the record comes from a
	// git repository whose history holds v3.
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	repo := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		if out, err := runIn(repo, "git", append([]string{"-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"}, args...)...); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q")
	os.WriteFile(filepath.Join(repo, "go.mod"), []byte("module "+CoreModule+"\n"), 0o644)
	for p, f := range templateCopy(t) {
		full := filepath.Join(repo, "templates", filepath.FromSlash(p))
		os.MkdirAll(filepath.Dir(full), 0o755)
		os.WriteFile(full, f.Data, 0o644)
	}
	git("add", "-A")
	git("commit", "-qm", "v3")
	os.Remove(rec)
	notGit := fakeCore(t)
	if _, err := runCLI(t, newerTemplate(t), "update", "--rebuild-base", "--core", notGit, dir); err == nil || !strings.Contains(err.Error(), "git") {
		t.Fatalf("a checkout without history: err = %v", err)
	}
	out, err := runCLI(t, newerTemplate(t), "update", "--rebuild-base", "--core", repo, dir)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if got, _ := os.ReadFile(rec); string(got) != string(want) {
		t.Fatalf("record rebuilt from git differs from the original\n%s\n%s", out, firstDiff(string(want), string(got)))
	}
}

// TestVerifyPlan: a config whose random weights do not fit is verified scaled down, and
// the plan says so; the demo config is verified as it is.
func TestVerifyPlan(t *testing.T) {
	core := coreDir(t)
	out, err := runCLI(t, templates.FS, "model", "m7", "--hf-config", filepath.Join(core, "testdata", "hf-configs", "mistral-7b.json"), "--out", filepath.Join(t.TempDir(), "m"), "--dry-run", "--verify")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "scaled-down config") || !strings.Contains(out, "would take 27.") {
		t.Errorf("Mistral-7B dry run does not announce a scaled verify:\n%s", out)
	}
	out, err = runCLI(t, templates.FS, "model", "demo", "--out", filepath.Join(t.TempDir(), "d"), "--dry-run", "--verify")
	if err != nil || !strings.Contains(out, "the config's random weights (0.0 GiB") {
		t.Errorf("demo dry run: %v\n%s", err, out)
	}
}

// TestCheckReportsAllSkippedAsSkip: an item whose tests all skipped proves nothing.
func TestCheckReportsAllSkippedAsSkip(t *testing.T) {
	for out, want := range map[string]bool{
		"=== RUN   TestCompile\n    k_test.go:9: no NVRTC\n--- SKIP: TestCompile (0.00s)\nok  \tx\t0.1s\n": true,
		"ok  \tx\t0.1s [no tests to run]\n": true,
		"=== RUN   TestA\n--- SKIP: TestA (0.00s)\n=== RUN   TestB\n--- PASS: TestB (0.00s)\nok\n": false,
		"ok  \tx\t0.1s\n": false,
	} {
		if reason, got := allSkipped(out); got != want {
			t.Errorf("allSkipped(%q) = %v (%s), want %v", out, got, reason, want)
		}
	}
	if r, _ := allSkipped("=== RUN   TestCompile\n    k_test.go:9: no NVRTC\n--- SKIP: TestCompile (0.00s)\n"); !strings.Contains(r, "no NVRTC") {
		t.Errorf("reason %q lacks the skip message", r)
	}
}

// TestTidyIsBounded: a `go mod tidy` that never finishes is stopped at tidyTimeout with an
// error saying so, instead of hanging the scaffolder.
func TestTidyIsBounded(t *testing.T) {
	bin := t.TempDir()
	fake := "#!/bin/sh\nsleep 60\n"
	if err := os.WriteFile(filepath.Join(bin, "go"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	saved := tidyTimeout
	tidyTimeout = 200 * time.Millisecond
	defer func() { tidyTimeout = saved }()
	var out strings.Builder
	err := goModTidy(&out, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "no result within") {
		t.Fatalf("err = %v, want a timeout", err)
	}
}

// TestDeepSeekV4Base: the reference model is a base of its own. A standalone scaffold from
// it type-checks with its tests (go vet) and generates offline; the published
// DeepSeek-V4-Flash config.json picks it by architecture and, far too large for random
// weights here, is verified with the base's demo config; --set of a dimension is refused
// (the base reads its config.json). The scaffold's tests are not run: its files are the
// in-tree model's renamed (TestGolden), whose tests run in models/deepseek-v4-flash.
func TestDeepSeekV4Base(t *testing.T) {
	core := coreDir(t)
	cfg := filepath.Join(core, "testdata", "hf-configs", "deepseek-v4-flash.json")
	out, err := runCLI(t, templates.FS, "model", "v4", "--hf-config", cfg, "--out", filepath.Join(t.TempDir(), "v4"), "--dry-run", "--verify")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "template deepseek-v4") || !strings.Contains(out, "the base's demo config.json") {
		t.Errorf("the V4-Flash config should pick the deepseek-v4 base and verify scaled:\n%s", out)
	}
	if _, err := runCLI(t, templates.FS, "model", "v4", "--base", "deepseek-v4", "--set", "hidden_size=64", "--out", filepath.Join(t.TempDir(), "v4")); err == nil || !strings.Contains(err.Error(), "config.json") {
		t.Errorf("--set hidden_size on the deepseek-v4 base: err = %v", err)
	}
	if testing.Short() {
		t.Skip("builds a whole generated runtime")
	}
	shareScaffoldBuilds(t)
	dir := filepath.Join(t.TempDir(), "v4")
	if out, err := runCLI(t, templates.FS, "model", "v4", "--base", "deepseek-v4", "--out", dir); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := runIn(dir, "go", "vet", "./..."); err != nil {
		t.Fatalf("go vet ./... in the scaffold: %v\n%s", err, out)
	}
	out, err = runIn(dir, "go", "run", "./cmd/v4", "generate", "--prompt-ids", "1,2,3,4", "--max-tokens", "4")
	if err != nil || !strings.Contains(out, "tokens: [") {
		t.Fatalf("the scaffold did not generate: %v\n%s", err, out)
	}
}

package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/weights"
	"github.com/resin-llm/resin/templates"
)

func TestMerge3(t *testing.T) {
	base := "a\nb\nc\nd\ne\n"
	cases := []struct {
		name, ours, theirs, want string
		conflicts                int
	}{
		{"only ours", "a\nB\nc\nd\ne\n", base, "a\nB\nc\nd\ne\n", 0},
		{"only theirs", base, "a\nb\nc\nD\ne\n", "a\nb\nc\nD\ne\n", 0},
		{"both, apart", "A\nb\nc\nd\ne\n", "a\nb\nc\nd\nE\n", "A\nb\nc\nd\nE\n", 0},
		{"same change", "a\nX\nc\nd\ne\n", "a\nX\nc\nd\ne\n", "a\nX\nc\nd\ne\n", 0},
		{"insert and delete", "a\nb\nnew\nc\nd\ne\n", "a\nb\nc\ne\n", "a\nb\nnew\nc\ne\n", 0},
		{"conflict", "a\nOURS\nc\nd\ne\n", "a\nTHEIRS\nc\nd\ne\n",
			"a\n<<<<<<< o\nOURS\n||||||| b\nb\n=======\nTHEIRS\n>>>>>>> t\nc\nd\ne\n", 1},
	}
	for _, c := range cases {
		got, n := merge3([]byte(base), []byte(c.ours), []byte(c.theirs), "o", "b", "t")
		if string(got) != c.want || n != c.conflicts {
			t.Errorf("%s: got %d conflicts\n%s\nwant %d\n%s", c.name, n, got, c.conflicts, c.want)
		}
	}
	// No base (a file new in the template that the user also created).
	got, n := merge3(nil, []byte("x\n"), []byte("y\n"), "o", "b", "t")
	if n != 1 || !strings.Contains(string(got), "x\n") || !strings.Contains(string(got), "y\n") {
		t.Errorf("baseless merge: %d conflicts\n%s", n, got)
	}
}

func TestRecordRoundTrip(t *testing.T) {
	files := []Rendered{
		{Path: "a.go", Content: []byte("package a\n"), Owner: ScaffoldOwned},
		{Path: "b/no-newline.txt", Content: []byte("-- tricky 3 --\nno newline"), Owner: ScaffoldOwned},
		{Path: "user.go", Content: []byte("user"), Owner: UserOwned},
	}
	got, err := decodeRecord(encodeRecord(files))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || string(got["a.go"].content) != "package a\n" || string(got["b/no-newline.txt"].content) != "-- tricky 3 --\nno newline" {
		t.Fatalf("record round trip: %v", got)
	}
	if got["a.go"].owner != ScaffoldOwned || got["user.go"].owner != UserOwned || string(got["user.go"].content) != "user" {
		t.Fatalf("record round trip lost the owners: %v", got)
	}
	// A path that leaves the scaffold is refused.
	if _, err := decodeRecord([]byte("# resin-new\n-- ../x 1 --\nx\n")); err == nil {
		t.Fatal("record entry ../x accepted")
	}
	if _, err := decodeRecord([]byte("# resin-new\n-- a.go 99 --\nshort\n")); err == nil {
		t.Fatal("truncated record accepted")
	}
}

func TestInsertAtMarker(t *testing.T) {
	src := []byte("x := []int{\n\t1,\n\t// +m\n}\n")
	once, changed, err := insertAtMarker(src, "// +m", "2,")
	if err != nil || !changed || string(once) != "x := []int{\n\t1,\n\t2,\n\t// +m\n}\n" {
		t.Fatalf("first insert: %q %v %v", once, changed, err)
	}
	twice, changed, err := insertAtMarker(once, "// +m", "2,")
	if err != nil || changed || string(twice) != string(once) {
		t.Fatalf("second insert changed the file: %q", twice)
	}
	if _, _, err := insertAtMarker(src, "// +missing", "2,"); err == nil {
		t.Fatal("missing marker accepted")
	}
}

func TestChecklist(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "CHECKLIST.md"), []byte(`# c
- [ ] **Passes**: `+"`true`"+`
- [ ] **Fails**: `+"`echo boom; false`"+`
- [ ] **Needs a GPU** (gpu): `+"`false`"+`
- [x] **By hand** (gpu, manual): `+"`anything`"+`
- [ ] **Needs a GPU too** (gpu; a note, with commas): `+"`false`"+`
not an item `+"`false`"+`
`), 0o644)
	out, err := runCLI(t, templates.FS, "check", dir)
	if err == nil || !strings.Contains(err.Error(), "1 of 5 items failed") {
		t.Fatalf("err = %v\n%s", err, out)
	}
	for _, want := range []string{"PASS  1. Passes", "FAIL  2. Fails", "| boom", "SKIP  3. Needs a GPU (needs a GPU", "SKIP  4. By hand (manual step)", "SKIP  5. Needs a GPU too (needs a GPU"} {
		if !strings.Contains(out, want) {
			t.Errorf("check output lacks %q:\n%s", want, out)
		}
	}
}

// TestChecklistGPUItemsAreTagged checks that every item of a base's and the skill's
// checklist whose command runs on a GPU (--device cuda, RESIN_GPU=1) is tagged (gpu) as
// check reads it, so that check on a machine without one skips it instead of failing
// (the dense base's "Generates on the GPU" carried "(gpu; ...)", which check missed).
func TestChecklistGPUItemsAreTagged(t *testing.T) {
	core := coreDir(t)
	files, _ := filepath.Glob(filepath.Join(core, "templates", "*", "CHECKLIST.md.tmpl"))
	files = append(files, filepath.Join(core, "skills", "add-resin-model", "CHECKLIST.md"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range parseChecklist(data) {
			onGPU := strings.Contains(it.Command, "--device cuda") || strings.Contains(it.Command, "RESIN_GPU=1")
			if onGPU && !it.GPU {
				t.Errorf("%s:%d: %q runs on a GPU but check does not read it as tagged (gpu)", f, it.Line, it.Title)
			}
		}
	}
}

// TestChecklistTimeoutStopsTheWholeItem checks that --timeout ends every process an item
// started, not only its shell: a command's children kept its output open, so check waited
// for them (and they ran on) long after the limit.
func TestChecklistTimeoutStopsTheWholeItem(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "CHECKLIST.md"), []byte("# c\n- [ ] **Hangs**: `sh -c 'sleep 2; touch late'; true`\n"), 0o644)
	out, err := runCLI(t, templates.FS, "check", dir, "--timeout", "200ms")
	if err == nil || !strings.Contains(out, "FAIL  1. Hangs") {
		t.Fatalf("err = %v, want the item failed by the timeout\n%s", err, out)
	}
	time.Sleep(3 * time.Second) // past the child's sleep: had it survived, it has touched late
	if _, err := os.Stat(filepath.Join(dir, "late")); err == nil {
		t.Fatal("a process of the timed-out item ran on after the timeout")
	}
}

// TestSkillChecklistInSync checks that the skill's CHECKLIST.md and the one every scaffold
// carries list the same items in the same order.
func TestSkillChecklistInSync(t *testing.T) {
	core := coreDir(t)
	skill, err := os.ReadFile(filepath.Join(core, "skills", "add-resin-model", "CHECKLIST.md"))
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := os.ReadFile(filepath.Join(core, "templates", "dense", "CHECKLIST.md.tmpl"))
	if err != nil {
		t.Fatal(err)
	}
	a, b := parseChecklist(skill), parseChecklist(tmpl)
	if len(a) != len(b) {
		t.Fatalf("skill has %d items, template %d", len(a), len(b))
	}
	for i := range a {
		if a[i].Title != b[i].Title {
			t.Errorf("item %d: skill %q, template %q", i+1, a[i].Title, b[i].Title)
		}
	}
}

func TestList(t *testing.T) {
	out, err := runCLI(t, templates.FS, "list")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"dense", "Qwen3ForCausalLM", "llama,qwen2"} {
		if !strings.Contains(out, want) {
			t.Errorf("list lacks %q:\n%s", want, out)
		}
	}
}

func TestVendorCore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "v")
	if out, err := runCLI(t, templates.FS, "model", "v", "--out", dir, "--vendor-core", "--no-tidy"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	tree := readTree(t, dir)
	if !strings.Contains(tree["go.mod"], "=> ./third_party/resin") {
		t.Errorf("go.mod does not replace to the vendored core:\n%s", tree["go.mod"])
	}
	if tree["third_party/resin/go.mod"] == "" || tree["third_party/resin/core/engine/engine.go"] == "" {
		t.Error("core not vendored")
	}
	for p := range tree {
		if strings.HasSuffix(p, "_test.go") && strings.HasPrefix(p, "third_party/") {
			t.Errorf("vendored a test file: %s", p)
		}
	}
}

func TestModelFromHF(t *testing.T) {
	parse := func(js string) *weights.Config {
		t.Helper()
		c, err := weights.ParseConfig([]byte(js))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	dims := `"vocab_size":64,"hidden_size":32,"intermediate_size":64,"num_hidden_layers":1,"num_attention_heads":4,"num_key_value_heads":2`
	m, err := modelFromHF(parse(`{"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2",` + dims + `,"eos_token_id":[5,6],"torch_dtype":"float16"}`))
	if err != nil || !m.AttentionBias || m.EOSTokenID != 5 || m.DType != "f16" || m.HeadDim != 8 {
		t.Errorf("qwen2: %+v, %v", m, err)
	}
	// No architectures entry (the base came from --base): the base's default stays, rather
	// than an empty name in Architectures and the README.
	if m, err := modelFromHF(parse(`{"model_type":"llama",` + dims + `}`)); err != nil || m.Architecture != "LlamaForCausalLM" {
		t.Errorf("no architectures: architecture %q, %v", m.Architecture, err)
	}
	m, err = modelFromHF(parse(`{"architectures":["MistralForCausalLM"],"model_type":"mistral",` + dims + `,"sliding_window":4096}`))
	if err != nil || m.SlidingWindow != 4096 {
		t.Errorf("mistral: %+v, %v", m, err)
	}
	for name, js := range map[string]string{
		"gelu":          `{"model_type":"llama",` + dims + `,"hidden_act":"gelu"}`,
		"mlp bias":      `{"model_type":"llama",` + dims + `,"mlp_bias":true}`,
		"yarn":          `{"model_type":"llama",` + dims + `,"rope_scaling":{"rope_type":"yarn","factor":4}}`,
		"qwen2 windows": `{"model_type":"qwen2",` + dims + `,"use_sliding_window":true}`,
		// Both load only to be refused by the scaffold's own ParseConfig.
		"partial rotary": `{"model_type":"llama",` + dims + `,"partial_rotary_factor":0.5}`,
		"llama3 keys":    `{"model_type":"llama",` + dims + `,"rope_scaling":{"rope_type":"llama3","factor":8}}`,
	} {
		if _, err := modelFromHF(parse(js)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestMerge3OneSided checks, over random edits, that a merge where only one side changed
// the base returns that side exactly, and that identical changes merge cleanly.
func TestMerge3OneSided(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	words := []string{"a\n", "b\n", "c\n", "func f() {}\n", "\n", "}\n"}
	randomText := func(n int) []string {
		var out []string
		for i := 0; i < n; i++ {
			out = append(out, words[rng.IntN(len(words))])
		}
		return out
	}
	edit := func(lines []string) []string {
		out := append([]string(nil), lines...)
		for k := rng.IntN(4); k >= 0; k-- {
			i := rng.IntN(len(out) + 1)
			switch rng.IntN(3) {
			case 0:
				out = append(out[:i], append([]string{words[rng.IntN(len(words))]}, out[i:]...)...)
			case 1:
				if i < len(out) {
					out = append(out[:i], out[i+1:]...)
				}
			default:
				if i < len(out) {
					out[i] = "changed\n"
				}
			}
		}
		return out
	}
	join := func(ls []string) []byte { return []byte(strings.Join(ls, "")) }
	for trial := 0; trial < 500; trial++ {
		base := randomText(rng.IntN(12))
		side := edit(base)
		if got, n := merge3(join(base), join(side), join(base), "o", "b", "t"); n != 0 || string(got) != string(join(side)) {
			t.Fatalf("ours only: base %q ours %q got %q (%d conflicts)", base, side, got, n)
		}
		if got, n := merge3(join(base), join(base), join(side), "o", "b", "t"); n != 0 || string(got) != string(join(side)) {
			t.Fatalf("theirs only: base %q theirs %q got %q (%d conflicts)", base, side, got, n)
		}
		if got, n := merge3(join(base), join(side), join(side), "o", "b", "t"); n != 0 || string(got) != string(join(side)) {
			t.Fatalf("same edit: base %q side %q got %q (%d conflicts)", base, side, got, n)
		}
	}
}

func TestTemplatize(t *testing.T) {
	a := &Answers{Name: "deepseek-v4-flash", Package: "deepseekv4flash", Import: "github.com/resin-llm/resin/models/deepseek-v4-flash"}
	src := "package deepseekv4flash\n\n// go run ./cmd/deepseek-v4-flash; deepseekv4flash.Open\nimport m \"github.com/resin-llm/resin/models/deepseek-v4-flash/kernels\"\nconst Name = \"deepseek-v4-flash\"\nvar s = \"{{x}}\"\nvar m = map[string]int{\"deepseek-v4-flash\": 1}\nconst k = \"deepseekv4flash_add_rmsnorm\"\n"
	got := string(templatize([]byte(src), a))
	want := "package {{.Package}}\n\n// go run ./cmd/{{.Name}}; {{.Package}}.Open\nimport m \"{{.Import}}/kernels\"\nconst Name = {{ printf \"%q\" .Name }}\nvar s = \"{{\"{{\"}}x{{\"}}\"}}\"\nvar m = map[string]int{{\"{\"}}{{ printf \"%q\" .Name }}: 1}\nconst k = \"{{.Package}}_add_rmsnorm\"\n"
	if got != want {
		t.Fatalf("templatize:\n%s\nwant\n%s", got, want)
	}
	// Rendered back with the same answers, it is the source again.
	out, err := execute("t", got, a)
	if err != nil || string(out) != src {
		t.Fatalf("render of the template: %v\n%s", err, out)
	}
}

// TestSkillOwnershipLists checks that the skill's two lists of files (yours, written once;
// the scaffold's, re-rendered by update) name every file of the dense base under its
// owner: they had left out gpu.go, config_strict_test.go, parity_test.go and the goldens
// scripts.
func TestSkillOwnershipLists(t *testing.T) {
	core := coreDir(t)
	skill, err := os.ReadFile(filepath.Join(core, "skills", "add-resin-model", "SKILL.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(skill)), " ")
	between := func(from, to string) string {
		i := strings.Index(text, from)
		if i < 0 {
			t.Fatalf("SKILL.md lacks %q", from)
		}
		rest := text[i+len(from):]
		j := strings.Index(rest, to)
		if j < 0 {
			t.Fatalf("SKILL.md: no %q after %q", to, from)
		}
		return rest[:j]
	}
	lists := map[Owner]string{
		UserOwned:     between("Files you own (written once):", "Files the scaffold owns"),
		ScaffoldOwned: between("Files the scaffold owns (", ") are re-rendered"),
	}
	bases, err := loadBases(templates.FS)
	if err != nil {
		t.Fatal(err)
	}
	dense, err := findBase(bases, "dense")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range dense.Manifest.Files {
		name := strings.ReplaceAll(f.Path, "{{.Name}}", "NAME")
		switch {
		case strings.HasPrefix(name, "cmd/NAME/"):
			name = "cmd/NAME"
		case strings.HasPrefix(name, "kernels/"):
			name = "kernels/"
		}
		owner := f.Owner
		if owner == "" {
			owner = ScaffoldOwned
		}
		if !strings.Contains(lists[owner], "`"+name+"`") {
			t.Errorf("SKILL.md's list of %s-owned files lacks `%s`", owner, name)
		}
	}
}

// TestVerifyInterrupted: an interrupt during --verify stops the running step, process group
// and all, and says that the scaffold is complete and verify was interrupted (exit 130);
// before, resin-new died silently.
func TestVerifyInterrupted(t *testing.T) {
	self, err := os.FindProcess(os.Getpid())
	if err != nil || runtime.GOOS == "windows" {
		t.Skip("no interrupt to send to this process here")
	}
	bin, dir := t.TempDir(), t.TempDir()
	started, late := filepath.Join(dir, "started"), filepath.Join(dir, "late")
	fake := fmt.Sprintf("#!/bin/sh\ntouch %s\nsleep 3\ntouch %s\n", started, late)
	if err := os.WriteFile(filepath.Join(bin, "go"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	done := make(chan error, 1)
	var out strings.Builder
	go func() { done <- verify(&out, dir, &Answers{Name: "demo"}, verifyPlan{}) }()
	for i := 0; ; i++ {
		if _, err := os.Stat(started); err == nil {
			break
		}
		if i == 1000 {
			t.Fatal("the verify step did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := self.Signal(os.Interrupt); err != nil {
		t.Skipf("cannot interrupt this process: %v", err)
	}
	err = <-done
	if !errors.Is(err, ErrVerifyInterrupted) || !strings.Contains(err.Error(), "scaffold in "+dir+" is complete") || exitCode(err) != 130 {
		t.Fatalf("err = %v (exit %d), want an interrupted verify naming the complete scaffold, exit 130", err, exitCode(err))
	}
	time.Sleep(4 * time.Second) // past the step's sleep: had it survived, it has touched late
	if _, err := os.Stat(late); err == nil {
		t.Error("the interrupted step ran on")
	}
}

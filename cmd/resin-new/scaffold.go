package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/resin-llm/resin/core/weights"
)

// CoreModule is the module path of the Resin core.
const CoreModule = "github.com/resin-llm/resin"

// modelOptions are the flags of `resin-new model`.
type modelOptions struct {
	name, base, hfConfig, out, module, core string
	runner                                  string // "go" (default) or "python"
	inTree, dryRun, force, verify           bool
	linkCore, vendorCore, noTidy            bool
	sets                                    []string
}

// write is one file operation of a scaffold, prepared in memory.
type write struct {
	path    string // absolute
	content []byte
	mode    os.FileMode
	what    string // "create", "overwrite", "update", "backup"
	owner   Owner
}

// scaffoldModel renders a model and writes it (or, with dryRun, prints what it would
// write). Nothing is written unless every step before the writes succeeds, and the writes
// themselves are one transaction (txn.go).
func scaffoldModel(w io.Writer, tfs fs.FS, o modelOptions) error {
	pkg, err := validateName(o.name)
	if err != nil {
		return err
	}
	bases, err := loadBases(tfs)
	if err != nil {
		return err
	}
	if o.runner == "" {
		o.runner = RunnerGo
	}
	all := bases
	if bases, err = basesFor(all, o.runner); err != nil {
		return err
	}
	if o.runner == RunnerPython && o.base != "" {
		// --runner python --base qwen3 means the Python base's qwen3 preset.
		if _, err := findBase(bases, o.base); err != nil {
			if _, err := findBase(bases, "python-"+o.base); err == nil {
				o.base = "python-" + o.base
			}
		}
	}
	a := &Answers{Name: o.name, Package: pkg}
	base, hfJSON, err := chooseBase(bases, o, a)
	if err != nil {
		return runnerHint(err, all, o)
	}
	a.Base = base.Name
	if hfJSON != nil {
		a.HFConfig = filepath.Base(o.hfConfig)
	}
	if base.Manifest.Runner == RunnerPython {
		a.Runner = RunnerPython
	}
	a.TemplateVersion = base.Manifest.Version
	for _, kv := range o.sets {
		key, _, _ := strings.Cut(kv, "=")
		switch {
		case hfJSON != nil && !runnerAnswer(key):
			return fmt.Errorf("--set %s with --hf-config: the runtime reads config.json, which is copied as is; edit %s instead (only %s apply on top of it)",
				strings.TrimSpace(key), o.hfConfig, strings.Join(runnerAnswers, " and "))
		case base.fileConfig() && !runnerAnswer(key):
			return fmt.Errorf("--set %s: base %s takes its dimensions from its config.json (or --hf-config), not from answers; only %s can be set",
				strings.TrimSpace(key), base.Name, strings.Join(runnerAnswers, " and "))
		}
		if err := a.Model.applySet(kv); err != nil {
			return err
		}
	}
	if err := base.validateModel(&a.Model); err != nil {
		return err
	}

	var root, top, coreDir string
	switch {
	case o.inTree && o.out != "":
		return errors.New("--in-tree and --out exclude each other: --in-tree writes models/NAME in this checkout, --out a standalone repository")
	case o.inTree && o.module != "":
		return fmt.Errorf("--module does not apply to --in-tree (the module is %s)", CoreModule)
	case o.inTree && (o.vendorCore || o.linkCore):
		return errors.New("--vendor-core and --link-core apply to --out only")
	case o.vendorCore && o.linkCore:
		return errors.New("--vendor-core and --link-core exclude each other (vendoring is the default)")
	case !o.inTree && o.out == "":
		return errors.New("pass --out DIR (a standalone repository) or --in-tree (models/NAME in this checkout)")
	}
	// The real run needs the checkout (to register an in-tree model, to vendor the core), so
	// a dry run that is to predict it checks it too.
	if coreDir, err = findCore(o.core); err != nil {
		return err
	}
	if o.inTree {
		a.Layout, a.Module = "in-tree", CoreModule
		a.Import = CoreModule + "/models/" + o.name
		root = filepath.Join(coreDir, "models", o.name)
	} else {
		a.Layout = "standalone"
		a.Module = o.module
		if a.Module == "" {
			a.Module = "example.com/" + o.name
		}
		if err := validateModule(a.Module); err != nil {
			return err
		}
		a.Import = a.Module
		if root, err = filepath.Abs(o.out); err != nil {
			return fmt.Errorf("--out: %w", err)
		}
		a.VendorCore, a.Core = true, "./"+VendorDir
		if o.linkCore {
			a.VendorCore, a.Core = false, replacePath(root, coreDir)
		}
		if a.Requires, err = coreRequires(coreDir); err != nil {
			return err
		}
	}
	top = filepath.Dir(root)

	rendered, err := render(base, a)
	if err != nil {
		return err
	}
	ownConfig := fileContent(rendered, "config.json")
	if hfJSON != nil {
		rendered = replaceFile(rendered, Rendered{Path: "config.json", Content: hfJSON, Owner: UserOwned})
	}
	if !o.dryRun {
		if err := recoverTxns(top, filepath.Base(root), func(s string) { fmt.Fprintln(w, "note:", s) }); err != nil {
			return err
		}
	}
	if err := checkTarget(root, coreDir, o.force); err != nil {
		return err
	}
	var writes []write
	for _, f := range rendered {
		writes = append(writes, newWrite(root, f))
	}
	writes = append(writes, write{path: filepath.Join(root, RecordFile), content: encodeRecord(rendered), mode: 0o644, owner: ScaffoldOwned})
	if a.Layout == "standalone" {
		sum, err := os.ReadFile(filepath.Join(coreDir, "go.sum"))
		if err != nil {
			return fmt.Errorf("read the core's go.sum: %w", err)
		}
		writes = append(writes, write{path: filepath.Join(root, "go.sum"), content: sum, mode: 0o644, owner: UserOwned})
		if a.VendorCore {
			vf, err := vendorCore(coreDir, a.runner() == RunnerPython)
			if err != nil {
				return err
			}
			for _, f := range vf {
				writes = append(writes, write{path: filepath.Join(root, filepath.FromSlash(VendorDir), filepath.FromSlash(f.rel)), content: f.content, mode: 0o644, owner: ScaffoldOwned})
			}
		}
	}
	if o.inTree {
		regPath := filepath.Join(coreDir, "models", "registry.go")
		src, err := os.ReadFile(regPath)
		if err != nil {
			return fmt.Errorf("register %s: %w", o.name, err)
		}
		out, changed, err := registerModel(src, a)
		if err != nil {
			return err
		}
		if changed {
			writes = append(writes, write{path: regPath, content: out, mode: 0o644, what: "update", owner: ScaffoldOwned})
		}
	}
	backups, backupAt, err := backupEdits(root, writes)
	if err != nil {
		return err
	}
	writes = append(writes, backups...)
	vp, err := planVerify(a, base, fileContent(rendered, "config.json"), ownConfig)
	if err != nil {
		return err
	}
	var pyErr error
	if o.verify && a.runner() == RunnerPython {
		// Checked before anything is written: --verify generates through the Python runner.
		if vp.python, pyErr = findRunnerPython(coreDir); pyErr != nil && !o.dryRun {
			return fmt.Errorf("--verify: %w (or scaffold without --verify)", pyErr)
		}
	}
	if o.dryRun {
		fmt.Fprintf(w, "dry run: would write %d files under %s (template %s v%s)\n", len(writes), root, base.Name, a.TemplateVersion)
		for _, wr := range writes {
			fmt.Fprintf(w, "  %-9s %-8s %6d  %s\n", wr.what, wr.owner, len(wr.content), rel(root, wr.path))
		}
		if o.verify && pyErr != nil {
			fmt.Fprintf(w, "then verify: would refuse: %v\n", pyErr)
		} else if o.verify {
			fmt.Fprintf(w, "then verify: %s\n", vp.describe())
		}
		return nil
	}
	if err := commitWrites(top, filepath.Base(root), writes, nil); err != nil {
		return err
	}
	fmt.Fprintf(w, "scaffolded %s (%s, template %s v%s) in %s: %d files\n", o.name, a.Layout, base.Name, a.TemplateVersion, root, len(writes))
	if len(backups) > 0 {
		fmt.Fprintf(w, "note: --force replaced %d files that differed from the new render; the previous versions are under %s\n", len(backups), backupAt)
	}
	if a.Layout == "standalone" && !a.VendorCore {
		fmt.Fprintf(w, "note: --link-core: go.mod replaces the core with %s, which a clone on another machine does not have\n", a.Core)
	}
	if a.Layout == "standalone" && !o.noTidy {
		if err := goModTidy(w, root); err != nil {
			fmt.Fprintf(w, "note: go mod tidy did not complete (%v); the go.mod as written builds, run `go mod tidy` in %s to trim it\n", err, root)
		}
	}
	if o.verify {
		return verify(w, root, a, vp)
	}
	return nil
}

// chooseBase picks the base and fills a.Model: from --hf-config (the base that implements
// its architecture; an explicit --base must implement it too) or from --base's preset.
func chooseBase(bases []*Base, o modelOptions, a *Answers) (*Base, []byte, error) {
	if o.hfConfig == "" {
		name := o.base
		if name == "" {
			name = defaultBase(bases)
		}
		base, err := findBase(bases, name)
		if err != nil {
			return nil, nil, err
		}
		a.Model = base.preset(name)
		return base, nil, nil
	}
	hfJSON, err := os.ReadFile(o.hfConfig)
	if err != nil {
		return nil, nil, fmt.Errorf("--hf-config: %w", err)
	}
	// The architecture picks the base; the base then reads the config its own way.
	var head struct {
		Architectures []string `json:"architectures"`
		ModelType     string   `json:"model_type"`
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(hfJSON, &head); err != nil {
		return nil, nil, fmt.Errorf("--hf-config %s: malformed config.json: %w", o.hfConfig, err)
	}
	if err := json.Unmarshal(hfJSON, &raw); err != nil {
		return nil, nil, fmt.Errorf("--hf-config %s: malformed config.json: %w", o.hfConfig, err)
	}
	arch := ""
	if len(head.Architectures) > 0 {
		arch = head.Architectures[0]
	}
	var base *Base
	if o.base != "" {
		if base, err = findBase(bases, o.base); err != nil {
			return nil, nil, err
		}
		if !base.implements(arch, head.ModelType) {
			return nil, nil, fmt.Errorf("--base %s does not implement %s's architecture %q (it implements %s)%s; a scaffold from it would compute another model",
				o.base, o.hfConfig, arch, strings.Join(base.Manifest.Architectures, ", "), droppedFields(raw))
		}
	} else if base, err = baseForArchitecture(bases, arch); err != nil {
		return nil, nil, err
	}
	if head.ModelType == "" {
		head.ModelType = base.modelTypeFor(arch)
	}
	if base.fileConfig() {
		a.Model = base.preset(base.Name)
		a.Model.Architecture, a.Model.ModelType = arch, head.ModelType
		return base, hfJSON, nil
	}
	cfg, err := weights.ParseConfig(hfJSON)
	if err != nil {
		return nil, nil, fmt.Errorf("--hf-config %s: %w", o.hfConfig, err)
	}
	if cfg.ModelType == "" {
		// As the runtime's ParseConfig does: the architecture names the variant (a Qwen2
		// config without model_type still has its q/k/v biases).
		cfg.ModelType = head.ModelType
	}
	if a.Model, err = modelFromHF(cfg); err != nil {
		return nil, nil, fmt.Errorf("--hf-config %s: %w", o.hfConfig, err)
	}
	return base, hfJSON, nil
}

// defaultBase is the base a scaffold starts from without --base or --hf-config: dense
// among the Go bases, else the first base (python-runner among the Python ones).
func defaultBase(bases []*Base) string {
	for _, b := range bases {
		if b.Name == "dense" {
			return b.Name
		}
	}
	return bases[0].Name
}

// runnerHint adds to a base-choice error the --runner that would have found the base: a
// base of the other runner kind is not unknown, it only needs the flag.
func runnerHint(err error, all []*Base, o modelOptions) error {
	if o.base == "" {
		if o.hfConfig != "" && o.runner == RunnerPython {
			return fmt.Errorf("%w; with --runner python the bases are %s", err, baseNames(all, RunnerPython))
		}
		return err
	}
	b, ferr := findBase(all, o.base)
	if ferr != nil {
		other := RunnerPython
		if o.runner == RunnerPython {
			other = RunnerGo
		}
		return fmt.Errorf("unknown base %q (known: %s; with --runner %s: %s)", o.base, baseAndAliasNames(all, o.runner), other, baseAndAliasNames(all, other))
	}
	if b.Manifest.Runner == o.runner {
		return err
	}
	if o.runner == RunnerPython {
		return fmt.Errorf("--base %s runs its model in Go; with --runner python the bases are %s (the Python runner starts as the Llama-family reference: --base llama, qwen2, qwen3 or mistral picks its variant)", o.base, baseNames(all, RunnerPython))
	}
	return fmt.Errorf("--base %s runs its model in Python: pass --runner python", o.base)
}

// baseAndAliasNames lists the names and aliases of the bases of one runner kind.
func baseAndAliasNames(bases []*Base, runner string) string {
	var names []string
	for _, b := range bases {
		if b.Manifest.Runner == runner {
			names = append(append(names, b.Name), b.Manifest.Aliases...)
		}
	}
	return strings.Join(names, ", ")
}

// baseNames lists the names of the bases of one runner kind.
func baseNames(bases []*Base, runner string) string {
	var names []string
	for _, b := range bases {
		if b.Manifest.Runner == runner {
			names = append(names, b.Name)
		}
	}
	return strings.Join(names, ", ")
}

// droppedFields names the settings of cfg that no dense base reads, for the error that
// refuses it: the MoE, per-layer window and partial-rotary keys of Mixtral, Qwen2-MoE,
// Phi-3 and their kind.
func droppedFields(raw map[string]json.RawMessage) string {
	var found []string
	for _, k := range []string{"num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "n_routed_experts",
		"sliding_window", "use_sliding_window", "layer_types", "partial_rotary_factor", "original_max_position_embeddings"} {
		if v, ok := raw[k]; ok && string(v) != "null" && string(v) != "false" {
			found = append(found, k)
		}
	}
	if len(found) == 0 {
		return ""
	}
	return "; it would drop the config's " + strings.Join(found, ", ")
}

// checkTarget refuses a target that --force must not write over: the Resin checkout
// itself or a directory above it, and a directory holding a Go module that is not a
// resin-new scaffold. A non-empty target needs --force.
func checkTarget(root, coreDir string, force bool) error {
	if r, err := filepath.Rel(root, coreDir); err == nil && (r == "." || !strings.HasPrefix(r, "..")) {
		return fmt.Errorf("target %s holds the Resin checkout %s; pick a directory outside it (or --in-tree)", root, coreDir)
	}
	n, err := nonEmpty(root)
	if err != nil || n == 0 {
		return err
	}
	if _, err := os.Stat(filepath.Join(root, AnswersFile)); err == nil {
		if !force {
			return fmt.Errorf("target %s is a resin-new scaffold already; `resin-new update %s` brings it to the current template, --force renders it anew (files it replaces are backed up)", root, root)
		}
		return nil
	}
	ents, err := os.ReadDir(root)
	if err != nil {
		return err
	}
	var others []string
	for _, e := range ents {
		if e.Name() != ".git" { // a repository made first (git init) holds nothing to lose
			others = append(others, e.Name())
		}
	}
	if len(others) == 0 {
		return nil
	}
	if len(others) > 3 {
		others = append(others[:3], "...")
	}
	return fmt.Errorf("target %s is not empty (%s) and is not a resin-new scaffold (no %s); pick a new or empty directory (--force writes only over a scaffold)", root, strings.Join(others, ", "), AnswersFile)
}

const (
	backupDir   = ".resin/backup"
	stampLayout = "20060102-150405"
)

// backupStamp is the directory this run saves replaced files under.
func backupStamp(root string) string {
	return filepath.Join(root, filepath.FromSlash(backupDir), time.Now().UTC().Format(stampLayout))
}

// backupEdits returns writes that save, under .resin/backup/STAMP/, every existing file
// under root that a write would replace with other content: --force never discards an
// edit without a copy.
func backupEdits(root string, ws []write) (backups []write, dir string, err error) {
	dir = backupStamp(root)
	for i := range ws {
		wr := &ws[i]
		if wr.what == "" {
			wr.what = "create"
		}
		have, err := os.ReadFile(wr.path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, "", err
		}
		if wr.what == "create" {
			wr.what = "overwrite"
		}
		r, err := filepath.Rel(root, wr.path)
		if err != nil || strings.HasPrefix(r, "..") || bytes.Equal(have, wr.content) {
			continue // outside the scaffold (models/registry.go) or unchanged
		}
		st, _ := os.Stat(wr.path)
		backups = append(backups, write{path: filepath.Join(dir, r), content: have, mode: st.Mode().Perm(), what: "backup", owner: wr.owner})
	}
	return backups, dir, nil
}

func newWrite(root string, f Rendered) write {
	mode := os.FileMode(0o644)
	if f.Exec {
		mode = 0o755
	}
	return write{path: filepath.Join(root, filepath.FromSlash(f.Path)), content: f.Content, mode: mode, owner: f.Owner}
}

// fileContent returns the content of the rendered file at path (nil if there is none).
func fileContent(files []Rendered, path string) []byte {
	for _, f := range files {
		if f.Path == path {
			return f.Content
		}
	}
	return nil
}

func replaceFile(files []Rendered, f Rendered) []Rendered {
	for i := range files {
		if files[i].Path == f.Path {
			files[i] = f
			return files
		}
	}
	return append(files, f)
}

// commitWrites writes ws and removes the files removes (absolute paths, all below top) as
// one transaction.
func commitWrites(top, target string, ws []write, removes []string) error {
	var cs []change
	for _, wr := range ws {
		r, err := filepath.Rel(top, wr.path)
		if err != nil || strings.HasPrefix(r, "..") {
			return fmt.Errorf("write %s: outside %s", wr.path, top)
		}
		cs = append(cs, change{rel: filepath.ToSlash(r), content: wr.content, mode: wr.mode})
	}
	for _, p := range removes {
		r, err := filepath.Rel(top, p)
		if err != nil || strings.HasPrefix(r, "..") {
			return fmt.Errorf("remove %s: outside %s", p, top)
		}
		cs = append(cs, change{rel: filepath.ToSlash(r), remove: true})
	}
	return commitChanges(top, target, cs)
}

// nonEmpty counts the entries of dir; a missing dir counts 0, a file is an error.
func nonEmpty(dir string) (int, error) {
	st, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if !st.IsDir() {
		return 0, fmt.Errorf("target %s exists and is not a directory", dir)
	}
	ents, err := os.ReadDir(dir)
	return len(ents), err
}

// findCore returns the Resin checkout: flag if given, else the directory above the
// working directory whose go.mod declares the core module.
func findCore(flag string) (string, error) {
	dir := flag
	if dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return "", err
		}
		for d := wd; ; d = filepath.Dir(d) {
			if isCore(d) {
				return d, nil
			}
			if filepath.Dir(d) == d {
				return "", fmt.Errorf("no Resin checkout (a go.mod declaring %s) above %s; run resin-new inside one or pass --core DIR", CoreModule, wd)
			}
		}
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if !isCore(abs) {
		return "", fmt.Errorf("--core %s: no go.mod declaring %s there", dir, CoreModule)
	}
	return abs, nil
}

func isCore(dir string) bool {
	data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "module" {
			return f[1] == CoreModule
		}
	}
	return false
}

// replacePath is the go.mod replace target for core as seen from root: relative when root
// lies inside the checkout (golden scaffolds stay portable), absolute otherwise.
func replacePath(root, core string) string {
	if core == "" {
		return "../resin"
	}
	if r, err := filepath.Rel(core, root); err == nil && !strings.HasPrefix(r, "..") {
		back, _ := filepath.Rel(root, core)
		return filepath.ToSlash(back)
	}
	return filepath.ToSlash(core)
}

func rel(root, p string) string {
	if r, err := filepath.Rel(root, p); err == nil {
		return filepath.ToSlash(r)
	}
	return p
}

// runnerAnswers are the model answers rendered into the runtime's code rather than into
// config.json, so they take effect on top of a copied HF config.
var runnerAnswers = []string{"page_tokens", "seed"}

func runnerAnswer(key string) bool {
	return slices.Contains(runnerAnswers, strings.TrimPrefix(strings.TrimSpace(key), "model."))
}

// tidyTimeout bounds each `go mod tidy` run: a module graph that cannot resolve must not
// hang the scaffolder.
var tidyTimeout = 3 * time.Minute

// goModTidy trims the standalone go.mod: offline first, from the module cache and the
// copied go.sum (building the core here filled it), then through the module proxy the
// environment names. Each run is bounded by tidyTimeout.
func goModTidy(w io.Writer, root string) error {
	run := func(env ...string) error {
		ctx, cancel := context.WithTimeout(context.Background(), tidyTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "mod", "tidy")
		cmd.Dir = root
		cmd.Env = append(append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off"), env...)
		killGroupOnCancel(cmd)
		cmd.WaitDelay = 5 * time.Second
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("go mod tidy gave no result within %s", tidyTimeout)
			}
			return fmt.Errorf("%w: %s", err, strings.TrimSpace(out.String()))
		}
		return nil
	}
	fmt.Fprintf(w, "go mod tidy (offline first, then the module proxy; at most %s each)\n", tidyTimeout)
	if err := run("GOPROXY=off"); err != nil {
		return run()
	}
	return nil
}

// modelFromHF maps an HF config onto the model answers.
func modelFromHF(c *weights.Config) (ModelAnswer, error) {
	m := defaultModel()
	m.ModelType = c.ModelType
	if a := c.Architecture(); a != "" {
		m.Architecture = a
	}
	if m.ModelType == "" {
		m.ModelType = "llama"
	}
	m.VocabSize, m.HiddenSize, m.IntermediateSize = c.VocabSize, c.HiddenSize, c.IntermediateSize
	m.NumHiddenLayers, m.NumAttentionHeads, m.NumKeyValueHeads = c.NumHiddenLayers, c.NumAttentionHeads, c.NumKeyValueHeads
	m.HeadDim, m.RMSNormEps, m.RopeTheta = c.HeadDim, c.RMSNormEps, c.RopeTheta
	m.TieWordEmbeddings, m.AttentionBias = c.TieWordEmbeddings, c.AttentionBias
	if c.MaxPositionEmbeddings > 0 {
		m.MaxPositionEmbeddings = c.MaxPositionEmbeddings
	}
	switch c.ModelType {
	case "qwen2":
		m.AttentionBias = true // Qwen2 always has q/k/v biases
		if c.UseSlidingWindow {
			return m, fmt.Errorf("use_sliding_window with max_window_layers is not supported by the dense base")
		}
	case "qwen3":
		m.QKNorm = true
		if c.UseSlidingWindow {
			return m, fmt.Errorf("use_sliding_window with max_window_layers is not supported by the dense base")
		}
	case "mistral":
		m.SlidingWindow = c.SlidingWindow
	}
	if c.MLPBias {
		return m, fmt.Errorf("mlp_bias: the dense base has no biases on gate/up/down")
	}
	if c.HiddenAct != "silu" {
		return m, fmt.Errorf("hidden_act %q: the dense base implements SwiGLU (silu)", c.HiddenAct)
	}
	if k := c.RopeScaling.Kind(); k != "default" && k != "linear" && k != "llama3" {
		return m, fmt.Errorf("rope_scaling type %q: the dense base implements default, linear and llama3", k)
	}
	// What the scaffold's ParseConfig refuses is refused here too, before anything is written.
	if rs := c.RopeScaling; rs.Kind() == "linear" && !(rs.Factor > 0) {
		return m, fmt.Errorf("rope_scaling linear needs a positive factor, got %g", rs.Factor)
	} else if rs.Kind() == "llama3" && (!(rs.Factor > 0) || !(rs.LowFreqFactor > 0) || !(rs.HighFreqFactor > rs.LowFreqFactor) || rs.OriginalMaxPositionEmbeddings <= 0) {
		return m, fmt.Errorf("rope_scaling llama3 needs factor > 0, 0 < low_freq_factor < high_freq_factor and original_max_position_embeddings > 0")
	}
	if v, ok := c.Raw["partial_rotary_factor"]; ok && string(v) != "null" {
		if f, err := strconv.ParseFloat(string(v), 64); err != nil || f != 1 {
			return m, fmt.Errorf("partial_rotary_factor %s: the dense base rotates every head dimension", v)
		}
	}
	if len(c.BOSTokenID) > 0 {
		m.BOSTokenID = int(c.BOSTokenID[0])
	}
	if len(c.EOSTokenID) > 0 {
		m.EOSTokenID = int(c.EOSTokenID[0])
	}
	switch c.TorchDType {
	case "float32":
		m.DType = "f32"
	case "float16":
		m.DType = "f16"
	default:
		m.DType = "bf16"
	}
	return m, nil
}

package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/resin-llm/resin/core/weights"
)

// CoreModule is the module path of the Resin core.
const CoreModule = "github.com/resin-llm/resin"

// modelOptions are the flags of `resin-new model`.
type modelOptions struct {
	name, base, hfConfig, out, module, core string
	inTree, dryRun, force, verify           bool
	vendorCore, noTidy                      bool
	sets                                    []string
}

// write is one file operation of a scaffold, prepared in memory.
type write struct {
	path    string // absolute
	content []byte
	mode    os.FileMode
	what    string // "create", "overwrite", "update"
	owner   Owner
}

// scaffoldModel renders a model and writes it (or, with dryRun, prints what it would
// write). Nothing is written unless every step before the writes succeeds.
func scaffoldModel(w io.Writer, tfs fs.FS, o modelOptions) error {
	pkg, err := validateName(o.name)
	if err != nil {
		return err
	}
	bases, err := loadBases(tfs)
	if err != nil {
		return err
	}
	a := &Answers{Name: o.name, Package: pkg, Model: defaultModel()}
	var base *Base
	var hfJSON []byte
	if o.hfConfig != "" {
		hfJSON, err = os.ReadFile(o.hfConfig)
		if err != nil {
			return fmt.Errorf("--hf-config: %w", err)
		}
		cfg, err := weights.ParseConfig(hfJSON)
		if err != nil {
			return fmt.Errorf("--hf-config %s: %w", o.hfConfig, err)
		}
		if o.base != "" {
			base, err = findBase(bases, o.base)
		} else {
			base, err = baseForArchitecture(bases, cfg.Architecture())
		}
		if err != nil {
			return err
		}
		if a.Model, err = modelFromHF(cfg); err != nil {
			return fmt.Errorf("--hf-config %s: %w", o.hfConfig, err)
		}
	} else {
		if o.base == "" {
			o.base = "dense"
		}
		if base, err = findBase(bases, o.base); err != nil {
			return err
		}
	}
	a.Base = base.Name
	a.TemplateVersion = base.Manifest.Version
	for _, kv := range o.sets {
		if key, _, _ := strings.Cut(kv, "="); hfJSON != nil && !runnerAnswer(key) {
			return fmt.Errorf("--set %s with --hf-config: the runtime reads config.json, which is copied as is; edit %s instead (only %s apply on top of it)",
				strings.TrimSpace(key), o.hfConfig, strings.Join(runnerAnswers, " and "))
		}
		if err := a.Model.applySet(kv); err != nil {
			return err
		}
	}
	if err := a.Model.validate(); err != nil {
		return err
	}

	var root, coreDir string
	switch {
	case o.inTree && o.out != "":
		return errors.New("--in-tree and --out exclude each other: --in-tree writes models/NAME in this checkout, --out a standalone repository")
	case o.inTree && o.module != "":
		return fmt.Errorf("--module does not apply to --in-tree (the module is %s)", CoreModule)
	case o.inTree && o.vendorCore:
		return errors.New("--vendor-core applies to --out only")
	case !o.inTree && o.out == "":
		return errors.New("pass --out DIR (a standalone repository) or --in-tree (models/NAME in this checkout)")
	}
	if coreDir, err = findCore(o.core); err != nil && (o.inTree || !o.dryRun) {
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
		a.Core = replacePath(root, coreDir)
		if o.vendorCore {
			a.VendorCore, a.Core = true, "./third_party/resin"
		}
	}

	files, err := render(base, a)
	if err != nil {
		return err
	}
	if hfJSON != nil {
		files = replaceFile(files, Rendered{Path: "config.json", Content: hfJSON, Owner: UserOwned})
	}
	if !o.force {
		if n, err := nonEmpty(root); err != nil {
			return err
		} else if n > 0 {
			return fmt.Errorf("target %s is not empty (%d entries); pass --force to overwrite", root, n)
		}
	}
	var writes []write
	for _, f := range files {
		writes = append(writes, newWrite(root, f))
	}
	writes = append(writes, write{path: filepath.Join(root, RecordFile), content: encodeRecord(files), mode: 0o644, owner: ScaffoldOwned})
	if a.Layout == "standalone" && coreDir != "" {
		sum, err := os.ReadFile(filepath.Join(coreDir, "go.sum"))
		if err != nil {
			return fmt.Errorf("read the core's go.sum: %w", err)
		}
		writes = append(writes, write{path: filepath.Join(root, "go.sum"), content: sum, mode: 0o644, owner: UserOwned})
		if o.vendorCore {
			vw, err := vendorWrites(coreDir, filepath.Join(root, "third_party", "resin"))
			if err != nil {
				return err
			}
			writes = append(writes, vw...)
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
	for i := range writes {
		if writes[i].what == "" {
			writes[i].what = "create"
			if _, err := os.Stat(writes[i].path); err == nil {
				writes[i].what = "overwrite"
			}
		}
	}
	if o.dryRun {
		fmt.Fprintf(w, "dry run: would write %d files under %s (template %s v%s)\n", len(writes), root, base.Name, a.TemplateVersion)
		for _, wr := range writes {
			fmt.Fprintf(w, "  %-9s %-8s %6d  %s\n", wr.what, wr.owner, len(wr.content), rel(root, wr.path))
		}
		return nil
	}
	if err := applyWrites(writes); err != nil {
		return err
	}
	fmt.Fprintf(w, "scaffolded %s (%s, template %s v%s) in %s: %d files\n", o.name, a.Layout, base.Name, a.TemplateVersion, root, len(writes))
	if a.Layout == "standalone" && !o.noTidy {
		if err := goModTidy(root); err != nil {
			fmt.Fprintf(w, "note: go mod tidy did not complete (%v); run it in %s before building\n", err, root)
		}
	}
	if o.verify {
		return verify(w, root, a)
	}
	return nil
}

func newWrite(root string, f Rendered) write {
	mode := os.FileMode(0o644)
	if f.Exec {
		mode = 0o755
	}
	return write{path: filepath.Join(root, filepath.FromSlash(f.Path)), content: f.Content, mode: mode, owner: f.Owner}
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

// applyWrites writes every prepared file, creating directories as needed.
func applyWrites(ws []write) error {
	for _, wr := range ws {
		if err := os.MkdirAll(filepath.Dir(wr.path), 0o755); err != nil {
			return fmt.Errorf("write %s: %w", wr.path, err)
		}
		if err := os.WriteFile(wr.path, wr.content, wr.mode); err != nil {
			return fmt.Errorf("write %s: %w", wr.path, err)
		}
		if err := os.Chmod(wr.path, wr.mode); err != nil {
			return fmt.Errorf("write %s: %w", wr.path, err)
		}
	}
	return nil
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

// vendorWrites copies the core's packages (core/, go.mod, go.sum; no tests or testdata)
// under dst.
func vendorWrites(coreDir, dst string) ([]write, error) {
	var ws []write
	for _, f := range []string{"go.mod", "go.sum", "LICENSE"} {
		data, err := os.ReadFile(filepath.Join(coreDir, f))
		if errors.Is(err, fs.ErrNotExist) && f == "LICENSE" {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("vendor the core: %w", err)
		}
		ws = append(ws, write{path: filepath.Join(dst, f), content: data, mode: 0o644, owner: UserOwned})
	}
	err := filepath.WalkDir(filepath.Join(coreDir, "core"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, "_test.go") || !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		r, _ := filepath.Rel(coreDir, p)
		ws = append(ws, write{path: filepath.Join(dst, r), content: data, mode: 0o644, owner: UserOwned})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("vendor the core: %w", err)
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].path < ws[j].path })
	return ws, nil
}

// runnerAnswers are the model answers rendered into the runtime's code rather than into
// config.json, so they take effect on top of a copied HF config.
var runnerAnswers = []string{"page_tokens", "seed"}

func runnerAnswer(key string) bool {
	return slices.Contains(runnerAnswers, strings.TrimPrefix(strings.TrimSpace(key), "model."))
}

// goModTidy completes the standalone go.mod: through the module proxy the environment
// names, so that a fresh machine gets the core's dependencies, and, if that fails (no
// network), offline from the module cache and the copied go.sum.
func goModTidy(root string) error {
	run := func(env ...string) error {
		cmd := exec.Command("go", "mod", "tidy", "-e")
		cmd.Dir = root
		cmd.Env = append(append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off"), env...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%w: %s", err, strings.TrimSpace(out.String()))
		}
		return nil
	}
	if err := run(); err != nil {
		if offline := run("GOPROXY=off"); offline != nil {
			return err
		}
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

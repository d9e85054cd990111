package main

import (
	"bytes"
	"fmt"
	"go/format"
	"io/fs"
	"path"
	"slices"
	"sort"
	"strings"
	"text/template"

	"github.com/BurntSushi/toml"
	"github.com/Masterminds/sprig/v3"
)

// Owner says what `resin-new update` may do to a file.
type Owner string

const (
	// ScaffoldOwned files are re-rendered by update and merged three ways with local edits.
	ScaffoldOwned Owner = "scaffold"
	// UserOwned files are written once; update never touches them (the model math, kernels).
	UserOwned Owner = "user"
)

// Manifest is a base's manifest.toml.
type Manifest struct {
	Version       string   `toml:"version"`
	Summary       string   `toml:"summary"`
	Architectures []string `toml:"architectures"`
	Aliases       []string `toml:"aliases"`
	// Config says where a scaffold's config.json comes from: "answers" (rendered from the
	// model answers, which --set edits; the dense base) or "file" (the base's own
	// config.json template, or --hf-config's file; the answers then hold only what the
	// runtime's code takes: page_tokens and seed).
	Config string `toml:"config"`
	// Runner says what runs the model: "go" (the default: the model's Go forward in the
	// runtime's process) or "python" (a Python runner the runtime starts as a child and
	// drives through the runner protocol, core/wire). `resin-new model --runner` picks
	// among the bases of its kind.
	Runner  string     `toml:"runner"`
	Presets []Preset   `toml:"preset"`
	Files   []FileSpec `toml:"file"`
}

// Preset is what a base name or alias means without --hf-config: `--base qwen3` starts
// from a Qwen3 model, not from the base's Llama defaults.
type Preset struct {
	Name          string `toml:"name"` // the base's name or one of its aliases
	Architecture  string `toml:"architecture"`
	ModelType     string `toml:"model_type"`
	QKNorm        bool   `toml:"qk_norm"`
	AttentionBias bool   `toml:"attention_bias"`
	SlidingWindow int    `toml:"sliding_window"`
	PageTokens    int    `toml:"page_tokens"` // 0: the default
}

// implements reports whether the base computes a config of architecture arch (or, for a
// config without architectures, of model_type modelType).
func (b *Base) implements(arch, modelType string) bool {
	if arch != "" {
		return slices.Contains(b.Manifest.Architectures, arch)
	}
	return slices.ContainsFunc(b.Manifest.Presets, func(p Preset) bool { return p.ModelType == modelType })
}

// modelTypeFor returns the model_type of the base's preset for architecture arch, or "".
func (b *Base) modelTypeFor(arch string) string {
	for _, p := range b.Manifest.Presets {
		if p.Architecture == arch {
			return p.ModelType
		}
	}
	return ""
}

// fileConfig reports whether the base's config.json is a file rather than rendered from
// the answers.
func (b *Base) fileConfig() bool { return b.Manifest.Config == "file" }

// validateModel checks the model answers as the base reads them.
func (b *Base) validateModel(m *ModelAnswer) error {
	if b.fileConfig() {
		return m.validateRuntime()
	}
	return m.validate()
}

// preset returns the model answers --base name starts from.
func (b *Base) preset(name string) ModelAnswer {
	m := defaultModel()
	if b.fileConfig() {
		m = ModelAnswer{PageTokens: m.PageTokens, Seed: m.Seed}
	}
	for _, p := range b.Manifest.Presets {
		if p.Name == name {
			m.Architecture, m.ModelType = p.Architecture, p.ModelType
			m.QKNorm, m.AttentionBias, m.SlidingWindow = p.QKNorm, p.AttentionBias, p.SlidingWindow
			if p.PageTokens > 0 {
				m.PageTokens = p.PageTokens
			}
		}
	}
	return m
}

// FileSpec is one output of a scaffold: the file builder of kubebuilder's machinery.
type FileSpec struct {
	Path     string `toml:"path"`     // output path, itself a template ({{.Name}}, {{.Package}})
	Template string `toml:"template"` // template file in the base directory
	Owner    Owner  `toml:"owner"`
	Layout   string `toml:"layout"` // "" (all), "standalone" or "in-tree"
	Exec     bool   `toml:"exec"`   // written with mode 0755
}

// Rendered is one file of a render, in memory.
type Rendered struct {
	Path    string
	Content []byte
	Owner   Owner
	Exec    bool
}

// Base is a template directory and its manifest.
type Base struct {
	Name     string
	FS       fs.FS // rooted at the base directory
	Root     fs.FS // every base: a template "../dense/x.tmpl" is another base's file
	Manifest Manifest
}

// loadBases reads every base directory of root (one manifest.toml per directory).
func loadBases(root fs.FS) ([]*Base, error) {
	entries, err := fs.ReadDir(root, ".")
	if err != nil {
		return nil, fmt.Errorf("read templates: %w", err)
	}
	var bases []*Base
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		sub, err := fs.Sub(root, e.Name())
		if err != nil {
			return nil, err
		}
		data, err := fs.ReadFile(sub, "manifest.toml")
		if err != nil {
			return nil, fmt.Errorf("base %s: %w", e.Name(), err)
		}
		b := &Base{Name: e.Name(), FS: sub, Root: root}
		md, err := toml.Decode(string(data), &b.Manifest)
		if err != nil {
			return nil, fmt.Errorf("base %s: manifest.toml: %w", e.Name(), err)
		}
		if und := md.Undecoded(); len(und) > 0 {
			return nil, fmt.Errorf("base %s: manifest.toml: unknown keys %v", e.Name(), und)
		}
		switch b.Manifest.Config {
		case "":
			b.Manifest.Config = "answers"
		case "answers", "file":
		default:
			return nil, fmt.Errorf("base %s: manifest.toml: config %q, want \"answers\" or \"file\"", e.Name(), b.Manifest.Config)
		}
		switch b.Manifest.Runner {
		case "":
			b.Manifest.Runner = RunnerGo
		case RunnerGo, RunnerPython:
		default:
			return nil, fmt.Errorf("base %s: manifest.toml: runner %q, want %q or %q", e.Name(), b.Manifest.Runner, RunnerGo, RunnerPython)
		}
		for _, p := range b.Manifest.Presets {
			if p.Name != b.Name && !slices.Contains(b.Manifest.Aliases, p.Name) {
				return nil, fmt.Errorf("base %s: preset %q is neither the base nor one of its aliases", e.Name(), p.Name)
			}
			if !slices.Contains(b.Manifest.Architectures, p.Architecture) {
				return nil, fmt.Errorf("base %s: preset %q: architecture %q is not one the base implements", e.Name(), p.Name, p.Architecture)
			}
		}
		for _, f := range b.Manifest.Files {
			if f.Owner != ScaffoldOwned && f.Owner != UserOwned {
				return nil, fmt.Errorf("base %s: file %s: owner %q, want scaffold or user", e.Name(), f.Path, f.Owner)
			}
		}
		bases = append(bases, b)
	}
	sort.Slice(bases, func(i, j int) bool { return bases[i].Name < bases[j].Name })
	return bases, nil
}

// Runners a base can have (Manifest.Runner).
const (
	RunnerGo     = "go"
	RunnerPython = "python"
)

// basesFor returns the bases whose model runs on runner ("go" or "python").
func basesFor(bases []*Base, runner string) ([]*Base, error) {
	if runner != RunnerGo && runner != RunnerPython {
		return nil, fmt.Errorf("--runner %q: want %s (the model's forward in Go) or %s (a Python runner driven through the runner protocol)", runner, RunnerGo, RunnerPython)
	}
	var out []*Base
	for _, b := range bases {
		if b.Manifest.Runner == runner {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--runner %s: no base runs its model that way", runner)
	}
	return out, nil
}

// findBase returns the base called name or one of its aliases.
func findBase(bases []*Base, name string) (*Base, error) {
	var known []string
	for _, b := range bases {
		if b.Name == name || slices.Contains(b.Manifest.Aliases, name) {
			return b, nil
		}
		known = append(known, b.Name)
		known = append(known, b.Manifest.Aliases...)
	}
	return nil, fmt.Errorf("unknown base %q (known: %s)", name, strings.Join(known, ", "))
}

// baseForArchitecture returns the base that serves an HF architecture.
func baseForArchitecture(bases []*Base, arch string) (*Base, error) {
	var known []string
	for _, b := range bases {
		for _, a := range b.Manifest.Architectures {
			if a == arch {
				return b, nil
			}
			known = append(known, a)
		}
	}
	sort.Strings(known)
	if arch == "" {
		return nil, fmt.Errorf("config.json has no architectures entry; pass --base (supported architectures: %s)", strings.Join(known, ", "))
	}
	return nil, fmt.Errorf("architecture %q is not supported by any base (supported: %s); pass --base to start from the closest one", arch, strings.Join(known, ", "))
}

// funcMap is sprig's text functions without the ones that read the environment or make
// output depend on the clock or randomness: a render depends on its answers alone.
func funcMap() template.FuncMap {
	fm := sprig.TxtFuncMap()
	for name := range fm {
		switch {
		case name == "env", name == "expandenv", name == "getHostByName",
			name == "now", name == "uuidv4", name == "shuffle",
			strings.HasPrefix(name, "date"), strings.HasPrefix(name, "rand"),
			strings.HasPrefix(name, "gen"), strings.HasPrefix(name, "derive"),
			strings.HasPrefix(name, "build"), strings.HasPrefix(name, "encrypt"),
			strings.HasPrefix(name, "decrypt"), name == "htmlDate", name == "htmlDateInZone",
			name == "ago", name == "unixEpoch", name == "toDate", name == "mustToDate",
			name == "mustDateModify", name == "duration", name == "durationRound":
			delete(fm, name)
		}
	}
	return fm
}

// render renders every file of base for answers, in memory. Go files are gofmt'ed; an
// error in any template fails the whole render.
func render(b *Base, a *Answers) ([]Rendered, error) {
	var out []Rendered
	seen := map[string]bool{}
	for _, f := range b.Manifest.Files {
		if f.Layout != "" && f.Layout != a.Layout {
			continue
		}
		pb, err := execute("path of "+f.Template, f.Path, a)
		if err != nil {
			return nil, err
		}
		p := path.Clean(string(pb))
		if path.IsAbs(p) || strings.HasPrefix(p, "..") {
			return nil, fmt.Errorf("template %s: output path %q leaves the scaffold", f.Template, p)
		}
		if seen[p] {
			return nil, fmt.Errorf("template %s: output %s rendered twice", f.Template, p)
		}
		seen[p] = true
		src, err := b.readTemplate(f.Template)
		if err != nil {
			return nil, fmt.Errorf("base %s: %w", b.Name, err)
		}
		body, err := execute(f.Template, string(src), a)
		if err != nil {
			return nil, err
		}
		if strings.HasSuffix(p, ".go") {
			formatted, err := format.Source(body)
			if err != nil {
				return nil, fmt.Errorf("template %s renders Go that does not parse: %w", f.Template, err)
			}
			body = formatted
		}
		out = append(out, Rendered{Path: p, Content: body, Owner: f.Owner, Exec: f.Exec})
	}
	answers, err := encodeAnswers(a)
	if err != nil {
		return nil, err
	}
	out = append(out, Rendered{Path: AnswersFile, Content: answers, Owner: ScaffoldOwned})
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// readTemplate reads a template of the base, or with a "../" path one of another base (a
// reference-model base shares the dense base's go.mod, CI and test script).
func (b *Base) readTemplate(name string) ([]byte, error) {
	if !strings.HasPrefix(name, "../") {
		return fs.ReadFile(b.FS, name)
	}
	p := path.Join(b.Name, name)
	if strings.HasPrefix(p, "../") || b.Root == nil {
		return nil, fmt.Errorf("template %s leaves the templates", name)
	}
	return fs.ReadFile(b.Root, p)
}

func execute(name, src string, a *Answers) ([]byte, error) {
	t, err := template.New(name).Option("missingkey=error").Funcs(funcMap()).Parse(src)
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", name, err)
	}
	var b bytes.Buffer
	if err := t.Execute(&b, a); err != nil {
		return nil, fmt.Errorf("template %s: %w", name, err)
	}
	return b.Bytes(), nil
}

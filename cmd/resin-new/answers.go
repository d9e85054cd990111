package main

import (
	"bytes"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// AnswersFile is the name of the answers file at the root of every scaffold.
const AnswersFile = "resin.toml"

// Answers is everything a scaffold was rendered from; resin.toml records it so that
// `resin-new update` can render the same scaffold with a newer template.
type Answers struct {
	TemplateVersion string `toml:"template_version"`
	Name            string `toml:"name"`
	Package         string `toml:"package"`
	Module          string `toml:"module"`
	Base            string `toml:"base"`
	Layout          string `toml:"layout"` // "standalone" or "in-tree"
	// Import is the import path of the model package (Module, or Module/models/Name in-tree).
	Import string `toml:"import"`
	// Core is the replace target of github.com/resin-llm/resin in a standalone go.mod.
	Core       string `toml:"core"`
	VendorCore bool   `toml:"vendor_core"`
	// Runner is "python" for a runtime whose model is a Python runner (the base's runner;
	// empty for a Go model, so that the answers of Go scaffolds read as before).
	Runner string `toml:"runner,omitempty"`
	// HFConfig names the checkpoint config.json that --hf-config copied into the scaffold
	// (its file name; empty: config.json is the template's). The copy is the user's:
	// update never renders config.json over it (keepCopiedConfig).
	HFConfig string `toml:"hf_config,omitempty"`
	// Requires are the core's module requirements ("path version"), written into a
	// standalone go.mod so it builds before `go mod tidy`; not recorded.
	Requires []string    `toml:"-"`
	Model    ModelAnswer `toml:"model"`
}

// ModelAnswer holds the model's dimensions and options; they become the scaffold's
// config.json and its defaults.
type ModelAnswer struct {
	Architecture          string  `toml:"architecture,omitempty,omitzero"`
	ModelType             string  `toml:"model_type,omitempty,omitzero"`
	VocabSize             int     `toml:"vocab_size,omitempty,omitzero"`
	HiddenSize            int     `toml:"hidden_size,omitempty,omitzero"`
	IntermediateSize      int     `toml:"intermediate_size,omitempty,omitzero"`
	NumHiddenLayers       int     `toml:"num_hidden_layers,omitempty,omitzero"`
	NumAttentionHeads     int     `toml:"num_attention_heads,omitempty,omitzero"`
	NumKeyValueHeads      int     `toml:"num_key_value_heads,omitempty,omitzero"`
	HeadDim               int     `toml:"head_dim,omitempty,omitzero"`
	RMSNormEps            float64 `toml:"rms_norm_eps,omitempty,omitzero"`
	RopeTheta             float64 `toml:"rope_theta,omitempty,omitzero"`
	MaxPositionEmbeddings int     `toml:"max_position_embeddings,omitempty,omitzero"`
	TieWordEmbeddings     bool    `toml:"tie_word_embeddings,omitempty,omitzero"`
	AttentionBias         bool    `toml:"attention_bias,omitempty,omitzero"`
	QKNorm                bool    `toml:"qk_norm,omitempty,omitzero"`
	SlidingWindow         int     `toml:"sliding_window,omitempty,omitzero"`
	BOSTokenID            int     `toml:"bos_token_id,omitempty,omitzero"`
	EOSTokenID            int     `toml:"eos_token_id,omitempty,omitzero"`
	DType                 string  `toml:"dtype,omitempty,omitzero"`
	PageTokens            int     `toml:"page_tokens,omitempty,omitzero"`
	Seed                  int64   `toml:"seed,omitempty,omitzero"`
}

// archRe matches an HF architecture: a Python class name.
var archRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// defaultModel is the dense base's demo model: small enough that random weights generate
// in milliseconds on one CPU core.
func defaultModel() ModelAnswer {
	return ModelAnswer{
		Architecture: "LlamaForCausalLM", ModelType: "llama",
		VocabSize: 512, HiddenSize: 128, IntermediateSize: 352, NumHiddenLayers: 2,
		NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 32,
		RMSNormEps: 1e-5, RopeTheta: 10000, MaxPositionEmbeddings: 2048,
		BOSTokenID: 1, EOSTokenID: 2, DType: "bf16", PageTokens: 16, Seed: 1,
	}
}

const (
	minContext    = 64
	maxPageTokens = 1024
)

// validateRuntime checks the answers a base with its own config.json reads: the runtime's
// page size and seed, and the architecture and model_type it records.
func (m *ModelAnswer) validateRuntime() error {
	if m.PageTokens <= 0 || m.PageTokens > maxPageTokens {
		return fmt.Errorf("model.page_tokens %d: want 1 to %d tokens per cache page (vLLM and SGLang use 16 to 256)", m.PageTokens, maxPageTokens)
	}
	if m.Seed < 0 {
		return fmt.Errorf("model.seed %d must not be negative (it seeds a uint64 generator)", m.Seed)
	}
	if m.Architecture != "" && !archRe.MatchString(m.Architecture) {
		return fmt.Errorf("model.architecture %q: want a class name such as DeepseekV4ForCausalLM", m.Architecture)
	}
	return nil
}

// validate checks the model answers for values no model can have.
func (m *ModelAnswer) validate() error {
	pos := map[string]int{
		"vocab_size": m.VocabSize, "hidden_size": m.HiddenSize, "intermediate_size": m.IntermediateSize,
		"num_hidden_layers": m.NumHiddenLayers, "num_attention_heads": m.NumAttentionHeads,
		"num_key_value_heads": m.NumKeyValueHeads, "head_dim": m.HeadDim,
		"max_position_embeddings": m.MaxPositionEmbeddings, "page_tokens": m.PageTokens,
	}
	for _, k := range slices.Sorted(maps.Keys(pos)) {
		if pos[k] <= 0 {
			return fmt.Errorf("model.%s must be positive, got %d", k, pos[k])
		}
	}
	if m.MaxPositionEmbeddings < minContext {
		return fmt.Errorf("model.max_position_embeddings %d: at least %d (the runtime's tests and --verify run sequences that long)", m.MaxPositionEmbeddings, minContext)
	}
	if m.NumAttentionHeads%m.NumKeyValueHeads != 0 {
		return fmt.Errorf("model.num_attention_heads %d must be a multiple of model.num_key_value_heads %d", m.NumAttentionHeads, m.NumKeyValueHeads)
	}
	if m.HeadDim%2 != 0 {
		return fmt.Errorf("model.head_dim %d must be even (rotary embeddings rotate pairs)", m.HeadDim)
	}
	if !(m.RMSNormEps > 0) || !(m.RopeTheta > 0) || math.IsInf(m.RMSNormEps, 0) || math.IsInf(m.RopeTheta, 0) {
		return fmt.Errorf("model.rms_norm_eps %g and model.rope_theta %g must be positive and finite", m.RMSNormEps, m.RopeTheta)
	}
	if err := m.validateRuntime(); err != nil {
		return err
	}
	if m.SlidingWindow < 0 {
		return fmt.Errorf("model.sliding_window must not be negative")
	}
	if m.QKNorm != (m.ModelType == "qwen3") {
		return fmt.Errorf("model.qk_norm %v with model_type %q: transformers applies q/k norm for qwen3 and only there, so the dense base does too", m.QKNorm, m.ModelType)
	}
	if m.SlidingWindow > 0 && m.ModelType != "mistral" {
		return fmt.Errorf("model.sliding_window %d: the dense base applies a window to model_type mistral only (model_type is %q)", m.SlidingWindow, m.ModelType)
	}
	if m.BOSTokenID < 0 || m.BOSTokenID >= m.VocabSize || m.EOSTokenID < 0 || m.EOSTokenID >= m.VocabSize {
		return fmt.Errorf("model.bos_token_id %d and model.eos_token_id %d must lie in [0, vocab_size %d)", m.BOSTokenID, m.EOSTokenID, m.VocabSize)
	}
	switch m.DType {
	case "bf16", "f16", "f32":
	default:
		return fmt.Errorf("model.dtype %q: want bf16, f16 or f32", m.DType)
	}
	if !archRe.MatchString(m.Architecture) {
		return fmt.Errorf("model.architecture %q: want a class name such as LlamaForCausalLM", m.Architecture)
	}
	if !nameRe.MatchString(strings.ToLower(strings.ReplaceAll(m.ModelType, "_", "-"))) {
		return fmt.Errorf("model.model_type %q: want an identifier such as llama or qwen2", m.ModelType)
	}
	return nil
}

// settable lists the keys --set accepts ("hidden_size" or "model.hidden_size").
func settable() []string {
	var keys []string
	t := reflect.TypeOf(ModelAnswer{})
	for i := 0; i < t.NumField(); i++ {
		keys = append(keys, "model."+tomlKey(t.Field(i)))
	}
	return keys
}

// tomlKey is a field's key in resin.toml (its tag without options such as omitempty).
func tomlKey(f reflect.StructField) string {
	k, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
	return k
}

// applySet assigns one --set key=value to the model answers.
func (m *ModelAnswer) applySet(kv string) error {
	key, val, ok := strings.Cut(kv, "=")
	if !ok || key == "" {
		return fmt.Errorf("--set %q: want key=value (keys: %s)", kv, strings.Join(settable(), ", "))
	}
	key = strings.TrimPrefix(strings.TrimSpace(key), "model.")
	v := reflect.ValueOf(m).Elem()
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		if tomlKey(t.Field(i)) != key {
			continue
		}
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Int, reflect.Int64:
			n, err := strconv.ParseInt(val, 10, 64)
			if err != nil {
				return fmt.Errorf("--set %s: %q is not an integer", key, val)
			}
			f.SetInt(n)
		case reflect.Float64:
			x, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return fmt.Errorf("--set %s: %q is not a number", key, val)
			}
			f.SetFloat(x)
		case reflect.Bool:
			b, err := strconv.ParseBool(val)
			if err != nil {
				return fmt.Errorf("--set %s: %q is not true or false", key, val)
			}
			f.SetBool(b)
		case reflect.String:
			f.SetString(val)
		}
		return nil
	}
	return fmt.Errorf("--set %s: unknown key (keys: %s)", key, strings.Join(settable(), ", "))
}

// encodeAnswers renders resin.toml.
func encodeAnswers(a *Answers) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("# resin.toml: the answers this runtime was scaffolded from (resin-new).\n")
	b.WriteString("# `resin-new update` re-renders the scaffold-owned files from them with a newer template.\n")
	if err := toml.NewEncoder(&b).Encode(a); err != nil {
		return nil, fmt.Errorf("encode %s: %w", AnswersFile, err)
	}
	return b.Bytes(), nil
}

// loadAnswers reads dir/resin.toml and validates every answer.
func loadAnswers(dir string) (*Answers, error) {
	path := filepath.Join(dir, AnswersFile)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read answers: %w (is %s a resin-new scaffold?)", err, dir)
	}
	return decodeAnswers(data, path)
}

// decodeAnswers parses and validates an answers file: unknown keys, and answers that are
// inconsistent with each other (a layout update does not know, a package that is not the
// name's, an import path that is not the module's), are errors naming the key.
func decodeAnswers(data []byte, path string) (*Answers, error) {
	var a Answers
	md, err := toml.Decode(string(data), &a)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return nil, fmt.Errorf("parse %s: unknown keys %v", path, und)
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...))
	}
	pkg, err := validateName(a.Name)
	if err != nil {
		return nil, bad("%v", err)
	}
	if a.Package != pkg {
		return nil, bad("package %q does not follow from name %q (want %q)", a.Package, a.Name, pkg)
	}
	if a.TemplateVersion == "" || a.Base == "" {
		return nil, bad("template_version and base must be set (they say which template rendered the scaffold)")
	}
	switch a.Runner {
	case "", RunnerGo, RunnerPython:
	default:
		return nil, bad("runner %q: want %q or %q", a.Runner, RunnerGo, RunnerPython)
	}
	switch a.Layout {
	case "in-tree":
		if a.Module != CoreModule || a.Import != CoreModule+"/models/"+a.Name {
			return nil, bad("an in-tree scaffold has module %q and import %q, got %q and %q", CoreModule, CoreModule+"/models/"+a.Name, a.Module, a.Import)
		}
		if a.Core != "" || a.VendorCore {
			return nil, bad("core and vendor_core apply to a standalone scaffold only")
		}
	case "standalone":
		if err := validateModule(a.Module); err != nil {
			return nil, bad("module: %v", err)
		}
		if a.Import != a.Module {
			return nil, bad("import %q must equal module %q in a standalone scaffold", a.Import, a.Module)
		}
		if a.VendorCore && a.Core != "./"+VendorDir {
			return nil, bad("vendor_core is true, so core must be %q, got %q", "./"+VendorDir, a.Core)
		}
		if a.Core == "" {
			return nil, bad("core (the replace target of %s) is empty", CoreModule)
		}
	default:
		return nil, bad("layout %q: want \"standalone\" or \"in-tree\"", a.Layout)
	}
	return &a, nil
}

// runner returns what runs the model of the answers: "go" or "python".
func (a *Answers) runner() string {
	if a.Runner == "" {
		return RunnerGo
	}
	return a.Runner
}

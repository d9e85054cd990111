package deepseekv4flash

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/resin-llm/resin/core/weights"
)

// notConvertedKeys are the quantization_config lists of modules an FP8 checkpoint keeps
// unquantized (BF16 or F32): transformers' modules_to_not_convert (alias ignored_layers,
// vLLM's name) and the "ignore" of compressed-tensors and of vLLM's and SGLang's configs.
var notConvertedKeys = []string{"ignore", "ignored_layers", "modules_to_not_convert"}

// parseQuantization parses quantization_config through weights.ParseQuantization after
// folding the "ignore" list into modules_to_not_convert and checking every module pattern
// of the three lists, naming the list of a bad one. An NVIDIA ModelOpt config is refused by
// name: its FP8 and NVFP4 formats are not the fine-grained FP8 this model dequantises.
func parseQuantization(raw json.RawMessage) (*weights.Quant, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(raw, &fields) != nil {
		return weights.ParseQuantization(raw) // its error names the problem
	}
	var method string
	_ = json.Unmarshal(fields["quant_method"], &method)
	if strings.EqualFold(method, "modelopt") {
		return nil, fmt.Errorf(`quantization_config.quant_method: %w: "modelopt" (NVIDIA ModelOpt FP8/NVFP4) is not supported by this model: it dequantises DeepSeek's fine-grained FP8 (quant_method "fp8", FP4 experts)`, weights.ErrFormat)
	}
	var not []string
	for _, key := range notConvertedKeys {
		v, ok := fields[key]
		if !ok || string(v) == "null" {
			continue
		}
		var pats []string
		if json.Unmarshal(v, &pats) != nil {
			return nil, fmt.Errorf("quantization_config.%s: %w: %s is not supported (want a list of module names or null)", key, weights.ErrFormat, v)
		}
		for _, pat := range pats {
			if err := checkModulePattern(pat); err != nil {
				return nil, fmt.Errorf("quantization_config.%s: %w: %q: %v", key, weights.ErrFormat, pat, err)
			}
		}
		not = append(not, pats...)
		delete(fields, key)
	}
	if len(not) > 0 {
		fields["modules_to_not_convert"], _ = json.Marshal(not)
	}
	raw, _ = json.Marshal(fields)
	return weights.ParseQuantization(raw)
}

// checkModulePattern checks one entry of a not-converted list: a module name, or "re:"
// and a regular expression.
func checkModulePattern(pat string) error {
	if pat == "" || pat == "re:" {
		return fmt.Errorf("empty module pattern")
	}
	if re, ok := strings.CutPrefix(pat, "re:"); ok {
		if _, err := regexp.Compile(re); err != nil {
			return err
		}
	}
	return nil
}

// notConverted returns the entry of q's not-converted list that covers the tensor name,
// if any. The module of "X.weight" is X. An entry "re:R" covers a module that R matches
// from its start (Python's re.match, as compressed-tensors applies it); any other entry
// covers the module it names, the modules under it ("layers.0.attn" covers
// "layers.0.attn.wo_a") and those whose name ends in "." and it ("wo_a" covers every
// layer's), as transformers' modules_to_not_convert does.
func notConverted(q *weights.Quant, name string) (string, bool) {
	if q == nil {
		return "", false
	}
	module := strings.TrimSuffix(name, ".weight")
	for _, pat := range q.NotConverted {
		if re, ok := strings.CutPrefix(pat, "re:"); ok {
			// parseQuantization checked the expression; one that does not compile covers nothing.
			if r, err := regexp.Compile("^(?:" + re + ")"); err == nil && r.MatchString(module) {
				return pat, true
			}
			continue
		}
		if module == pat || strings.HasPrefix(module, pat+".") || strings.HasSuffix(module, "."+pat) {
			return pat, true
		}
	}
	return "", false
}

// checkNotConverted refuses a tensor that q's not-converted list covers but that the
// checkpoint stores quantized (F8_E4M3 or packed FP4) or with a scale: the config says it
// is kept in BF16 or F32, so the file and the config disagree.
func checkNotConverted(ck *weights.Checkpoint, q *weights.Quant, name string) error {
	pat, ok := notConverted(q, name)
	if !ok {
		return nil
	}
	info, _ := ck.Info(name)
	scale, scaled := ck.ScaleName(name)
	switch {
	case info.DType != weights.F32 && info.DType != weights.BF16 && info.DType != weights.F16:
		return fmt.Errorf("tensor %q: %w: stored as %s, but quantization_config keeps it unquantized (%q in modules_to_not_convert or ignore)", name, weights.ErrDType, info.DType, pat)
	case scaled:
		return fmt.Errorf("tensor %q: %w: has a scale %q, but quantization_config keeps it unquantized (%q in modules_to_not_convert or ignore)", name, weights.ErrDType, scale, pat)
	}
	return nil
}

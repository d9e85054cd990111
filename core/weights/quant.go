package weights

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Quant is config.json's quantization_config for fine-grained FP8 checkpoints (DeepSeek-V3,
// V3.2 and V4, and others that transformers loads with FineGrainedFP8Config): dense linears
// stored as float8 e4m3 with one scale per BlockSize block, routed experts either the same
// or FP4 e2m1 with one scale per row per FP4Group elements.
//
// The keys and their allowed values are those of transformers 5.23.0's FineGrainedFP8Config
// (utils/quantization_config.py:1682-1743: quant_method, activation_scheme, weight_block_size,
// dequantize, modules_to_not_convert (alias ignored_layers), modules_to_convert,
// scale_fmt, expert_dtype) plus DeepSeek's "fmt": "e4m3".
type Quant struct {
	Method           string      // quant_method: "fp8"
	Format           string      // fmt: "e4m3" (the default when absent)
	ActivationScheme string      // activation_scheme: "dynamic" (default) or "static"
	BlockSize        [2]int      // weight_block_size: [rows, cols] of one scale's block, default [128, 128]
	ScaleFormat      ScaleFormat // scale_fmt: "float" (default) or "ue8m0"
	ExpertDType      ExpertDType // expert_dtype: "fp8" (default) or "fp4"
	Dequantize       bool        // dequantize: transformers' load-time flag, recorded only
	NotConverted     []string    // modules_to_not_convert (ignore, ignored_layers, exclude_modules): modules left unquantized
	Converted        []string    // modules_to_convert: extra modules quantized (embeddings)

	// NVIDIA ModelOpt (Method "modelopt", see parseModelOpt): Algo is quant_algo (AlgoFP8,
	// AlgoNVFP4 or AlgoMixed), Group the inputs per NVFP4 scale (group_size, 16), Layers
	// the algorithm of each module MIXED_PRECISION lists (quantized_layers), KVCache the
	// kv-cache scheme as given (recorded only: the CPU path caches float32).
	Algo    string
	Group   int
	Layers  map[string]string
	KVCache string

	expertSet bool // expert_dtype came from quantization_config itself
}

// ScaleFormat is how block scales are stored: ScaleFloat (F32 or BF16 tensors) or
// ScaleUE8M0 (F8_E8M0, or U8 bytes read as E8M0, powers of two).
type ScaleFormat string

// The scale formats of quantization_config.scale_fmt.
const (
	ScaleFloat ScaleFormat = "float"
	ScaleUE8M0 ScaleFormat = "ue8m0"
)

// ExpertDType is how routed experts are stored: ExpertFP8 like the dense linears, or
// ExpertFP4 (e2m1 packed two per I8 byte, see DequantFP4).
type ExpertDType string

// The expert formats of quantization_config.expert_dtype.
const (
	ExpertFP8 ExpertDType = "fp8"
	ExpertFP4 ExpertDType = "fp4"
)

// ParseQuantization parses config.json's quantization_config (Config.Raw["quantization_config"]).
// An absent or null value gives nil: the checkpoint is not quantized. quant_method "fp8"
// is fine-grained FP8 (below); "modelopt" is NVIDIA ModelOpt's FP8, NVFP4 or
// MIXED_PRECISION (parseModelOpt). An unknown key or an unsupported value is an error
// (matching ErrFormat) naming the field, so that a format this package cannot dequantise
// is refused instead of read wrongly.
func ParseQuantization(raw json.RawMessage) (*Quant, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, fmt.Errorf("quantization_config: %w: not a JSON object: %v", ErrFormat, err)
	}
	q := &Quant{Format: "e4m3", ActivationScheme: "dynamic", BlockSize: [2]int{128, 128}, ScaleFormat: ScaleFloat, ExpertDType: ExpertFP8}
	bad := func(key string, v json.RawMessage, want string) error {
		return fmt.Errorf("quantization_config.%s: %w: %s is not supported (want %s)", key, ErrFormat, v, want)
	}
	str := func(key string, v json.RawMessage, allowed ...string) (string, error) {
		var s string
		if err := json.Unmarshal(v, &s); err != nil || !slices.Contains(allowed, s) {
			return "", bad(key, v, strings.Join(quoted(allowed), " or "))
		}
		return s, nil
	}
	names := func(key string, v json.RawMessage) ([]string, error) {
		var s []string
		if err := json.Unmarshal(v, &s); err != nil {
			return nil, bad(key, v, "a list of module names or null")
		}
		return s, nil
	}
	var method string
	if json.Unmarshal(fields["quant_method"], &method) == nil && strings.EqualFold(method, "modelopt") {
		return parseModelOpt(fields)
	}
	var err error
	// quant_method first: a GPTQ or AWQ config is refused for its method, not for a key
	// of its own (bits, group_size) that sorts before it.
	keys := slices.Sorted(maps.Keys(fields))
	if i := slices.Index(keys, "quant_method"); i > 0 {
		keys = append(append([]string{"quant_method"}, keys[:i]...), keys[i+1:]...)
	}
	for _, key := range keys {
		v := fields[key]
		switch key {
		case "quant_method":
			q.Method, err = str(key, v, "fp8", "modelopt")
		case "fmt":
			q.Format, err = str(key, v, "e4m3")
		case "activation_scheme":
			// transformers lower-cases it before checking.
			var s string
			if json.Unmarshal(v, &s) != nil {
				err = bad(key, v, `"dynamic" or "static"`)
				break
			}
			q.ActivationScheme, err = str(key, json.RawMessage(fmt.Sprintf("%q", strings.ToLower(s))), "dynamic", "static")
		case "weight_block_size":
			var b []int
			if json.Unmarshal(v, &b) != nil || len(b) != 2 || b[0] <= 0 || b[1] <= 0 {
				// null means one scale per tensor in transformers; no checkpoint this
				// package loads uses it.
				err = bad(key, v, "two positive integers")
				break
			}
			q.BlockSize = [2]int{b[0], b[1]}
		case "scale_fmt":
			var s string
			s, err = str(key, v, string(ScaleFloat), string(ScaleUE8M0))
			q.ScaleFormat = ScaleFormat(s)
		case "expert_dtype":
			var s string
			s, err = str(key, v, string(ExpertFP8), string(ExpertFP4))
			q.ExpertDType, q.expertSet = ExpertDType(s), true
		case "dequantize":
			if json.Unmarshal(v, &q.Dequantize) != nil {
				err = bad(key, v, "true or false")
			}
		case "modules_to_not_convert", "ignored_layers", "ignore":
			// ignore is compressed-tensors' and vLLM's and SGLang's name for the list.
			var s []string
			if s, err = names(key, v); err != nil {
				break
			}
			for _, pat := range s {
				if perr := checkModulePattern(pat); perr != nil {
					err = fmt.Errorf("quantization_config.%s: %w: %q: %v", key, ErrFormat, pat, perr)
				}
			}
			q.NotConverted = append(q.NotConverted, s...)
		case "modules_to_convert":
			q.Converted, err = names(key, v)
		default:
			return nil, fmt.Errorf("quantization_config.%s: %w: unknown field", key, ErrFormat)
		}
		if err != nil {
			return nil, err
		}
	}
	if q.Method == "" {
		return nil, fmt.Errorf("quantization_config.quant_method: %w: missing (want \"fp8\" or \"modelopt\")", ErrFormat)
	}
	return q, nil
}

// FoldExpertDType applies a top-level config.json expert_dtype, as DeepSeek-V4 checkpoints
// ship it, when quantization_config itself does not set one (which V4.1 does): transformers
// folds it in the same way (5.23.0 models/deepseek_v4/configuration_deepseek_v4.py:247-255). raw is Config.Raw["expert_dtype"]; absent or null changes nothing.
func (q *Quant) FoldExpertDType(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" || q.expertSet {
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) != nil || (s != string(ExpertFP8) && s != string(ExpertFP4)) {
		return fmt.Errorf("expert_dtype: %w: %s is not supported (want \"fp8\" or \"fp4\")", ErrFormat, raw)
	}
	q.ExpertDType = ExpertDType(s)
	return nil
}

func quoted(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = fmt.Sprintf("%q", v)
	}
	return out
}

package weights

import (
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"
)

// The quant_algo values of an NVIDIA ModelOpt checkpoint (quant_method "modelopt") that
// Dequantize reads. W4A16_NVFP4 stores its weights as NVFP4 does (it differs only in not
// quantizing activations, which the CPU path never does), so it reads as AlgoNVFP4.
const (
	AlgoFP8   = "FP8"             // float8 e4m3 weights, one float32 weight_scale per matrix
	AlgoNVFP4 = "NVFP4"           // e2m1 pairs, e4m3 scale per Group inputs, float32 weight_scale_2
	AlgoMixed = "MIXED_PRECISION" // per module, from quantized_layers
)

// modelOptAlgos maps the quant_algo spellings accepted per module to the storage they read as.
var modelOptAlgos = map[string]string{AlgoFP8: AlgoFP8, AlgoNVFP4: AlgoNVFP4, "W4A16_NVFP4": AlgoNVFP4}

// parseModelOpt parses a ModelOpt quantization_config: the config.json form (quant_algo,
// group_size, ignore, kv_cache_scheme, producer, config_groups, quantized_layers beside
// quant_method) or the hf_quant_config.json form nested under "quantization" (whose list is
// exclude_modules and whose kv-cache field is kv_cache_quant_algo), as vLLM's
// ModelOptQuantConfigBase.from_config reads both. quant_algo is FP8, NVFP4 (or
// W4A16_NVFP4) or MIXED_PRECISION with a non-empty quantized_layers; anything else is
// refused naming the field and its value.
func parseModelOpt(fields map[string]json.RawMessage) (*Quant, error) {
	q := &Quant{Method: "modelopt", Group: 16}
	if v, ok := fields["quantization"]; ok && string(v) != "null" {
		var nested map[string]json.RawMessage
		if err := json.Unmarshal(v, &nested); err != nil {
			return nil, fmt.Errorf("quantization_config.quantization: %w: not a JSON object", ErrFormat)
		}
		fields = maps.Clone(fields)
		delete(fields, "quantization")
		for k, v := range nested {
			if _, dup := fields[k]; dup {
				return nil, fmt.Errorf("quantization_config.%s: %w: given both beside quant_method and under quantization", k, ErrFormat)
			}
			fields[k] = v
		}
	}
	bad := func(key string, v json.RawMessage, want string) error {
		return fmt.Errorf("quantization_config.%s: %w: %s is not supported (want %s)", key, ErrFormat, v, want)
	}
	algo := func(key string, v json.RawMessage) (string, error) {
		var s string
		if json.Unmarshal(v, &s) != nil {
			return "", bad(key, v, "a string")
		}
		s = strings.ToUpper(s)
		if a, ok := modelOptAlgos[s]; ok {
			return a, nil
		}
		return "", bad(key, v, `"FP8", "NVFP4", "W4A16_NVFP4" or, for the whole config, "MIXED_PRECISION"; the CPU path dequantises only these`)
	}
	var layers map[string]json.RawMessage
	for _, key := range slices.Sorted(maps.Keys(fields)) {
		v := fields[key]
		var err error
		switch key {
		case "quant_method":
		case "quant_algo":
			var s string
			if json.Unmarshal(v, &s) == nil && strings.EqualFold(s, AlgoMixed) {
				q.Algo = AlgoMixed
				break
			}
			q.Algo, err = algo(key, v)
		case "group_size":
			if json.Unmarshal(v, &q.Group) != nil || q.Group <= 0 || q.Group%2 != 0 {
				err = bad(key, v, "a positive even number of inputs per NVFP4 scale (16)")
			}
		case "ignore", "exclude_modules":
			var s []string
			if json.Unmarshal(v, &s) != nil {
				err = bad(key, v, "a list of module names or patterns")
				break
			}
			q.NotConverted = append(q.NotConverted, s...)
		case "kv_cache_scheme", "kv_cache_quant_algo":
			// Recorded only: the CPU path keeps its caches in float32.
			if string(v) != "null" {
				q.KVCache = string(v)
			}
		case "producer", "config_groups":
			// Descriptive (the exporter and its version; the scheme quant_algo names).
		case "quantized_layers":
			if json.Unmarshal(v, &layers) != nil {
				err = bad(key, v, "an object of module names to {quant_algo, group_size}")
			}
		default:
			return nil, fmt.Errorf("quantization_config.%s: %w: unknown field of a modelopt config", key, ErrFormat)
		}
		if err != nil {
			return nil, err
		}
	}
	if q.Algo == "" {
		return nil, fmt.Errorf("quantization_config.quant_algo: %w: missing in a modelopt config", ErrFormat)
	}
	for _, pat := range q.NotConverted {
		if err := checkModulePattern(pat); err != nil {
			return nil, fmt.Errorf("quantization_config.ignore: %w: %q: %v", ErrFormat, pat, err)
		}
	}
	if q.Algo == AlgoMixed && len(layers) == 0 {
		return nil, fmt.Errorf("quantization_config.quantized_layers: %w: quant_algo MIXED_PRECISION needs the algorithm of each quantized module", ErrFormat)
	}
	for _, m := range slices.Sorted(maps.Keys(layers)) {
		key := fmt.Sprintf("quantized_layers[%q]", m)
		var entry map[string]json.RawMessage
		if json.Unmarshal(layers[m], &entry) != nil {
			return nil, bad(key, layers[m], "{quant_algo, group_size}")
		}
		a, err := algo(key+".quant_algo", entry["quant_algo"])
		if err != nil {
			return nil, err
		}
		for k, v := range entry {
			switch k {
			case "quant_algo":
			case "group_size":
				var g int
				if json.Unmarshal(v, &g) != nil || g != q.Group {
					return nil, bad(key+".group_size", v, fmt.Sprintf("the config's group_size %d", q.Group))
				}
			default:
				return nil, fmt.Errorf("quantization_config.%s.%s: %w: unknown field", key, k, ErrFormat)
			}
		}
		if q.Algo != AlgoMixed && a != q.Algo {
			return nil, fmt.Errorf("quantization_config.%s.quant_algo: %w: %s contradicts quant_algo %s", key, ErrFormat, entry["quant_algo"], q.Algo)
		}
		if q.Layers == nil {
			q.Layers = map[string]string{}
		}
		q.Layers[m] = a
	}
	return q, nil
}

// checkModulePattern checks one entry of a not-converted list: a module name or glob, or
// "re:" and a regular expression.
func checkModulePattern(pat string) error {
	if pat == "" || pat == "re:" {
		return fmt.Errorf("empty module pattern")
	}
	if re, ok := strings.CutPrefix(pat, "re:"); ok {
		_, err := regexp.Compile(re)
		return err
	}
	if strings.ContainsAny(pat, "*?[") {
		_, err := path.Match(pat, "")
		return err
	}
	return nil
}

// NotConvertedBy returns the entry of q's not-converted list (modules_to_not_convert,
// ignored_layers, ignore or exclude_modules) that keeps the module of the tensor name
// unquantized, if any. The module of "X.weight" is X. An entry "re:R" covers a module R
// matches from its start (compressed-tensors' re.match); one with *, ? or [ is a glob over
// the whole module name (ModelOpt's fnmatch, where * crosses dots); any other covers the
// module it names, the modules under it and those whose name ends in "." and it
// (transformers' modules_to_not_convert).
func (q *Quant) NotConvertedBy(name string) (string, bool) {
	if q == nil {
		return "", false
	}
	module := strings.TrimSuffix(name, ".weight")
	for _, pat := range q.NotConverted {
		switch re, isRE := strings.CutPrefix(pat, "re:"); {
		case isRE:
			if r, err := regexp.Compile(re); err == nil {
				if loc := r.FindStringIndex(module); loc != nil && loc[0] == 0 {
					return pat, true
				}
			}
		case strings.ContainsAny(pat, "*?["):
			if ok, _ := path.Match(pat, module); ok {
				return pat, true
			}
		case module == pat || strings.HasPrefix(module, pat+".") || strings.HasSuffix(module, "."+pat):
			return pat, true
		}
	}
	return "", false
}

// layerAlgo returns the MIXED_PRECISION algorithm of module: its own quantized_layers
// entry or its nearest listed parent's ("...mlp.experts" covers each expert's
// projections), trying the model.language_model. and language_model.model. spellings of
// the name both.
func (q *Quant) layerAlgo(module string) (string, bool) {
	for m := module; m != ""; {
		for _, c := range nameForms(m) {
			if a, ok := q.Layers[c]; ok {
				return a, true
			}
		}
		i := strings.LastIndexByte(m, '.')
		if i < 0 {
			break
		}
		m = m[:i]
	}
	return "", false
}

func nameForms(m string) []string {
	if rest, ok := strings.CutPrefix(m, "model.language_model."); ok {
		return []string{m, "language_model.model." + rest}
	}
	if rest, ok := strings.CutPrefix(m, "language_model.model."); ok {
		return []string{m, "model.language_model." + rest}
	}
	return []string{m}
}

// modelOptScaleSuffixes name the tensors a ModelOpt checkpoint stores beside a quantized
// module: its weight scales (read with the weight), the activation scale and the kv-cache
// scales (not used: the CPU path runs activations and caches in float32).
var modelOptScaleSuffixes = []string{".weight_scale", ".weight_scale_2", ".input_scale", ".k_scale", ".v_scale"}

// ScaleTensor reports whether name is a scale tensor of q's format (one that a quantized
// weight carries beside it) rather than a model weight: "..._scale_inv" for fine-grained
// FP8, and ModelOpt's weight_scale, weight_scale_2, input_scale, k_scale and v_scale.
// DeepSeek-V4's "X.scale" needs the checkpoint to tell from a weight (see ScaleName).
func (q *Quant) ScaleTensor(name string) bool {
	if q == nil {
		return false
	}
	if q.Method == "modelopt" {
		return slices.ContainsFunc(modelOptScaleSuffixes, func(s string) bool { return strings.HasSuffix(name, s) })
	}
	return strings.HasSuffix(name, "_scale_inv")
}

// dequantizeModelOpt reads the weight name of a ModelOpt checkpoint: its algorithm is the
// config's quant_algo, or for MIXED_PRECISION its quantized_layers entry; a module the
// ignore list covers, or one quantized_layers does not list, is read as stored and must
// be BF16, F16 or F32 without a weight_scale. FP8 weights are F8_E4M3 with a weight_scale
// of one float32 per matrix; NVFP4 weights are U8 pairs of e2m1 codes [..., out, in/2]
// (low nibble first) with an F8_E4M3 weight_scale [..., out, in/Group] and a float32
// weight_scale_2 per matrix (DequantNVFP4). A stored dtype the config does not declare is
// refused naming the field that declares it.
func (c *Checkpoint) dequantizeModelOpt(info TensorInfo, q *Quant, shape []int) ([]float32, error) {
	name := info.Name
	base, isWeight := strings.CutSuffix(name, ".weight")
	algo, why := q.Algo, "quantization_config.quant_algo is "+q.Algo
	if pat, ok := q.NotConvertedBy(name); ok {
		algo, why = "", fmt.Sprintf("quantization_config.ignore keeps it unquantized (%q)", pat)
	} else if algo == AlgoMixed {
		var listed bool
		if algo, listed = q.layerAlgo(base); listed {
			why = fmt.Sprintf("quantization_config.quantized_layers lists %s as %s", base, algo)
		} else {
			why = fmt.Sprintf("quantization_config.quantized_layers does not list %s", base)
		}
	}
	if !isWeight {
		algo, why = "", "a modelopt checkpoint quantizes only modules' .weight tensors"
	}
	scaleName := base + ".weight_scale"
	_, scaled := c.Info(scaleName)
	switch {
	case unquantized(info.DType):
		if scaled && isWeight {
			return nil, fmt.Errorf("tensor %q: %w: %s weight has a scale tensor %q; %s", name, ErrDType, info.DType, scaleName, why)
		}
		if algo != "" && q.Algo == AlgoMixed {
			return nil, fmt.Errorf("tensor %q: %w: stored as %s, but %s", name, ErrDType, info.DType, why)
		}
		return c.Float32(name, shape...)
	case info.DType == F8E4M3 && algo == AlgoFP8:
		return c.dequantizeModelOptFP8(info, scaleName, shape)
	case info.DType == U8 && algo == AlgoNVFP4:
		return c.dequantizeNVFP4(info, q, scaleName, shape)
	case algo == "":
		return nil, fmt.Errorf("tensor %q: %w: stored as %s, but %s", name, ErrDType, info.DType, why)
	}
	return nil, fmt.Errorf("tensor %q: %w: stored as %s, but %s (FP8 weights are F8_E4M3, NVFP4 weights U8)", name, ErrDType, info.DType, why)
}

// unquantized reports whether dt is a plain float a weight is kept in unquantized.
func unquantized(dt DType) bool { return dt == F32 || dt == BF16 || dt == F16 || dt == F64 }

// matrices splits a logical shape [..., rows, cols] into its leading matrix count.
func matrices(name string, logical []int) (mats, rows, cols int, err error) {
	if len(logical) < 2 {
		return 0, 0, 0, fmt.Errorf("tensor %q: %w: quantized weights are matrices [..., out, in], model expects %v", name, ErrShape, logical)
	}
	mats = 1
	for _, d := range logical[:len(logical)-2] {
		mats *= d
	}
	return mats, logical[len(logical)-2], logical[len(logical)-1], nil
}

// globalScales reads a per-matrix float32 scale (weight_scale of FP8, weight_scale_2 of
// NVFP4): mats values, stored as a scalar, [1], or the weight's leading dimensions.
func (c *Checkpoint) globalScales(weight, scale string, mats int) ([]float32, error) {
	sinfo, ok := c.Info(scale)
	if !ok {
		return nil, fmt.Errorf("tensor %q: %w: its scale tensor %s is missing", weight, ErrNotFound, scale)
	}
	if sinfo.Elements() != mats || !unquantized(sinfo.DType) {
		return nil, fmt.Errorf("tensor %q: %w: scale %q is %s %v, want %d float value(s), one per matrix", weight, ErrShape, scale, sinfo.DType, sinfo.Shape, mats)
	}
	v, _, err := c.where[scale].Float32(scale)
	return v, err
}

func (c *Checkpoint) dequantizeModelOptFP8(info TensorInfo, scaleName string, shape []int) ([]float32, error) {
	name := info.Name
	mats, rows, cols, err := matrices(name, shape)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(info.Shape, shape) {
		return nil, fmt.Errorf("tensor %q: %w: checkpoint has %v of %s, model expects %v", name, ErrShape, info.Shape, info.DType, shape)
	}
	scale, err := c.globalScales(name, scaleName, mats)
	if err != nil {
		return nil, err
	}
	_, raw, err := c.where[name].ReadRaw(name)
	if err != nil {
		return nil, err
	}
	per := rows * cols
	out := make([]float32, mats*per)
	for m := range mats {
		// One block spanning the matrix: DequantFP8 with a single scale.
		if err := DequantFP8(out[m*per:(m+1)*per], raw[m*per:(m+1)*per], scale[m:m+1], rows, cols, max(rows, 1), max(cols, 1)); err != nil {
			return nil, fmt.Errorf("tensor %q: %w", name, err)
		}
	}
	c.progress.add(c, name, scaleName)
	return out, nil
}

func (c *Checkpoint) dequantizeNVFP4(info TensorInfo, q *Quant, scaleName string, shape []int) ([]float32, error) {
	name := info.Name
	mats, rows, cols, err := matrices(name, shape)
	if err != nil {
		return nil, err
	}
	if cols%q.Group != 0 {
		return nil, fmt.Errorf("tensor %q: %w: NVFP4 weights need in (%d) a multiple of group_size %d", name, ErrShape, cols, q.Group)
	}
	stored := append(slices.Clone(shape[:len(shape)-1]), cols/2)
	if !slices.Equal(info.Shape, stored) {
		return nil, fmt.Errorf("tensor %q: %w: checkpoint has %v of %s, model expects %v (stored as %v: two e2m1 codes a byte)", name, ErrShape, info.Shape, info.DType, shape, stored)
	}
	sinfo, ok := c.Info(scaleName)
	if !ok {
		return nil, fmt.Errorf("tensor %q: %w: its scale tensor %s is missing", name, ErrNotFound, scaleName)
	}
	wantScale := append(slices.Clone(shape[:len(shape)-1]), cols/q.Group)
	if sinfo.DType != F8E4M3 || !slices.Equal(sinfo.Shape, wantScale) {
		return nil, fmt.Errorf("tensor %q: %w: scale %q is %s %v, want F8_E4M3 %v (one per %d inputs)", name, ErrShape, scaleName, sinfo.DType, sinfo.Shape, wantScale, q.Group)
	}
	global, err := c.globalScales(name, info.Name+"_scale_2", mats)
	if err != nil {
		return nil, err
	}
	_, raw, err := c.where[name].ReadRaw(name)
	if err != nil {
		return nil, err
	}
	_, sraw, err := c.where[scaleName].ReadRaw(scaleName)
	if err != nil {
		return nil, err
	}
	per, wper, sper := rows*cols, rows*cols/2, rows*cols/q.Group
	out := make([]float32, mats*per)
	for m := range mats {
		if err := DequantNVFP4(out[m*per:(m+1)*per], raw[m*wper:(m+1)*wper], sraw[m*sper:(m+1)*sper], global[m], rows, cols, q.Group); err != nil {
			return nil, fmt.Errorf("tensor %q: %w", name, err)
		}
	}
	c.progress.add(c, name, scaleName, info.Name+"_scale_2")
	return out, nil
}

// DequantNVFP4 widens a row-major [rows, cols] NVFP4 matrix into dst: w holds rows ×
// cols/2 bytes of e2m1 codes (element 2k of a row in the low nibble of byte k, 2k+1 in
// the high nibble), scale rows × cols/group float8 e4m3 bytes, global the per-tensor
// float32 scale (ModelOpt's weight_scale_2):
//
//	dst[i*cols+j] = e2m1(nibble j of row i) * e4m3(scale[i*(cols/group) + j/group]) * global
//
// The product of an e2m1 value and an e4m3 scale is exact in float32, so each element is
// rounded once. The layout is ModelOpt's as vLLM and SGLang load it (vLLM's
// ModelOptNvFp4LinearMethod: weight uint8 [out, in/2], weight_scale float8_e4m3fn
// [out, in/group_size], weight_scale_2 float32; its NVFP4 embedding unpacks low then high).
func DequantNVFP4(dst []float32, w, scale []byte, global float32, rows, cols, group int) error {
	if rows < 0 || cols < 0 || group <= 0 || group%2 != 0 || cols%group != 0 {
		return fmt.Errorf("%w: nvfp4 dequant of [%d, %d] in groups of %d (columns a multiple of an even group)", ErrShape, rows, cols, group)
	}
	n, sc := rows*cols, cols/group
	if len(dst) != n || len(w) != n/2 || len(scale) != rows*sc {
		return fmt.Errorf("%w: nvfp4 dequant of [%d, %d] needs %d packed bytes and %d scales, got %d bytes, %d scales, room for %d",
			ErrShape, rows, cols, n/2, rows*sc, len(w), len(scale), len(dst))
	}
	half, gb := cols/2, group/2
	forRows(rows, 1, n, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			srow := scale[i*sc : (i+1)*sc]
			wrow := w[i*half : (i+1)*half]
			drow := dst[i*cols : (i+1)*cols]
			for g, sb := range srow {
				s := e4m3Table[sb]
				wb, db := wrow[g*gb:(g+1)*gb], drow[g*group:(g+1)*group]
				for k, v := range wb {
					p := &e2m1Pairs[v]
					db[2*k] = p[0] * s * global
					db[2*k+1] = p[1] * s * global
				}
			}
		}
	})
	return nil
}

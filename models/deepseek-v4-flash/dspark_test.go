package deepseekv4flash

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/weights"
)

// TestConfigDSparkKeys: a DeepSeek-V4-Flash-DSpark config's dspark_* keys are read and
// checked (a bad value is refused naming its key), and ParseConfig refuses a well-formed
// one, saying what was read and that ParseDSparkConfig reads it.
func TestConfigDSparkKeys(t *testing.T) {
	ratios := func(n int) string {
		r := []string{"0", "0"}
		for len(r) < n-1 {
			r = append(r, "4", "128")
		}
		return "[" + strings.Join(append(r[:n-1], "0"), ", ") + "]"
	}
	base := `"num_hidden_layers": 43, "vocab_size": 129280, "compress_ratios": ` + ratios(46)
	good := map[string]string{"dspark_block_size": "5", "dspark_noise_token_id": "128799", "dspark_target_layer_ids": "[40, 41, 42]", "dspark_markov_rank": "256"}
	cfg := func(change map[string]string) string {
		s := base
		for k, v := range good {
			if c, ok := change[k]; ok {
				v = c
			}
			if v != "" {
				s += `, "` + k + `": ` + v
			}
		}
		for k, v := range change {
			if _, ok := good[k]; !ok {
				s += `, "` + k + `": ` + v
			}
		}
		return "{" + s + "}"
	}
	_, err := ParseConfig([]byte(cfg(nil)))
	if err == nil || !strings.Contains(err.Error(), "block 5, noise token 128799, taps [40 41 42], Markov rank 256, 3 stages in mtp.0-2") ||
		!strings.Contains(err.Error(), "ParseDSparkConfig") {
		t.Errorf("a well-formed DSpark config: err = %v, want the drafter described and ParseDSparkConfig named", err)
	}
	if c, d, err := ParseDSparkConfig([]byte(cfg(nil))); err != nil || d.BlockSize != 5 || c.NumNextNPredictLayers != 0 {
		t.Errorf("ParseDSparkConfig: %v, %+v", err, d)
	}
	for _, tc := range []struct {
		change map[string]string
		want   string
	}{
		{map[string]string{"dspark_block_size": "0"}, "dspark_block_size 0"},
		{map[string]string{"dspark_block_size": `"5"`}, "dspark_block_size:"},
		{map[string]string{"dspark_noise_token_id": "129280"}, "dspark_noise_token_id 129280 is outside the vocabulary"},
		{map[string]string{"dspark_target_layer_ids": "[40, 43]"}, "43 is not one of the 43 main layers"},
		{map[string]string{"dspark_target_layer_ids": "[41, 41]"}, "layer 41 is tapped twice"},
		{map[string]string{"dspark_target_layer_ids": "[]"}, "dspark_target_layer_ids is empty"},
		{map[string]string{"dspark_markov_rank": "-1"}, "dspark_markov_rank -1 is negative"},
		{map[string]string{"dspark_markov_rank": ""}, "dspark_markov_rank is missing"},
		{map[string]string{"dspark_window": "128"}, "dspark_window: not a DSpark key"},
	} {
		_, err := ParseConfig([]byte(cfg(tc.change)))
		if err == nil || !strings.Contains(err.Error(), "DSpark") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want it to say %q", tc.change, err, tc.want)
		}
	}
	short := strings.Replace(cfg(nil), ratios(46), ratios(43), 1)
	if _, err := ParseConfig([]byte(short)); err == nil || !strings.Contains(err.Error(), "none left for the DSpark drafter's stages") {
		t.Errorf("43 compress_ratios for 43 layers: err = %v", err)
	}
}

// dsparkDir writes a tiny DeepSeek-V4-DSpark checkpoint: the tiny config with dspark_*
// keys and three drafter stages in mtp.0-2 (each a copy of the random MTP block, in
// upstream names), main_proj/main_norm on mtp.0 and the heads on mtp.2; edit changes the
// tensor list before it is written.
func dsparkDir(t *testing.T, edit func([]weights.Tensor) []weights.Tensor) string {
	t.Helper()
	c := tinyConfig(t)
	ts, err := RandomWeights(c, 7, true).Tensors(c, weights.F32, UpstreamNames)
	if err != nil {
		t.Fatal(err)
	}
	zeros := func(name string, shape ...int) weights.Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		tt, err := weights.NewTensor(name, weights.F32, shape, make([]float32, n))
		if err != nil {
			t.Fatal(err)
		}
		return tt
	}
	var stages []weights.Tensor
	for _, tt := range ts {
		rest, ok := strings.CutPrefix(tt.Name, "mtp.0.")
		if !ok {
			continue
		}
		switch {
		case slices.Contains([]string{"e_proj.weight", "h_proj.weight", "enorm.weight", "hnorm.weight", "emb.tok_emb.weight", "head.weight"}, rest):
		case rest == "norm.weight" || strings.HasPrefix(rest, "hc_head_"):
			tt.Name = "mtp.2." + rest
			stages = append(stages, tt)
		default:
			for i := range 3 {
				u := tt
				u.Name = fmt.Sprintf("mtp.%d.%s", i, rest)
				stages = append(stages, u)
			}
		}
	}
	h := c.HiddenSize
	stages = append(stages, zeros("mtp.0.main_proj.weight", h, 2*h), zeros("mtp.0.main_norm.weight", h),
		zeros("mtp.2.markov_head.markov_w1.weight", c.VocabSize, 8), zeros("mtp.2.markov_head.markov_w2.weight", c.VocabSize, 8),
		zeros("mtp.2.confidence_head.proj.weight", 1, h+8))
	if edit != nil {
		stages = edit(stages)
	}
	dir := t.TempDir()
	cfg := strings.Replace(tinyConfigJSON, `"model_type": "deepseek_v4",`,
		`"model_type": "deepseek_v4", "dspark_block_size": 4, "dspark_noise_token_id": 95, "dspark_target_layer_ids": [1, 2], "dspark_markov_rank": 8,`, 1)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := weights.WriteFile(filepath.Join(dir, "model.safetensors"), stages, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestLoadDSparkStages: a DSpark checkpoint's three drafter stages load with their
// shapes checked (the blocks, main_proj/main_norm, the last stage's heads); a missing or
// mis-shaped stage tensor and an mtp.* tensor no stage has are errors naming it.
func TestLoadDSparkStages(t *testing.T) {
	dir := dsparkDir(t, nil)
	c, d, st, err := LoadDSparkStages(dir)
	if err != nil {
		t.Fatal(err)
	}
	if d.Stages != 3 || len(st.Blocks) != 3 || d.BlockSize != 4 || c.NumHiddenLayers != 4 {
		t.Fatalf("config %+v, %d blocks", d, len(st.Blocks))
	}
	h := c.HiddenSize
	if len(st.MainProj) != 2*h*h || len(st.MarkovW1) != c.VocabSize*8 || len(st.Confidence) != h+8 || len(st.Norm) != h ||
		len(st.Blocks[2].QA) == 0 || len(st.Blocks[0].GateUp) == 0 {
		t.Errorf("stages not filled: main_proj %d, markov_w1 %d, confidence %d, norm %d", len(st.MainProj), len(st.MarkovW1), len(st.Confidence), len(st.Norm))
	}
	drop := func(name string) func([]weights.Tensor) []weights.Tensor {
		return func(ts []weights.Tensor) []weights.Tensor {
			return slices.DeleteFunc(ts, func(tt weights.Tensor) bool { return tt.Name == name })
		}
	}
	for _, tc := range []struct {
		what string
		edit func([]weights.Tensor) []weights.Tensor
		want string
	}{
		{"no main_norm", drop("mtp.0.main_norm.weight"), "MISSING [mtp.0.main_norm.weight]"},
		{"no stage 1 attention", drop("mtp.1.attn.wq_a.weight"), "mtp.1.attn.wq_a.weight"},
		{"a fourth stage", func(ts []weights.Tensor) []weights.Tensor {
			u := ts[0]
			u.Name = "mtp.3." + strings.SplitN(u.Name, ".", 3)[2]
			return append(ts, u)
		}, "UNEXPECTED [mtp.3."},
		{"main_proj for one tap", func(ts []weights.Tensor) []weights.Tensor {
			for i := range ts {
				if ts[i].Name == "mtp.0.main_proj.weight" {
					ts[i].Shape, ts[i].Data = []int{32, 32}, ts[i].Data[:32*32*4]
				}
			}
			return ts
		}, "mtp.0.main_proj.weight"},
	} {
		_, _, _, err := LoadDSparkStages(dsparkDir(t, tc.edit))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to name %q", tc.what, err, tc.want)
		}
	}
	// Without a confidence head the stages load too.
	if _, _, st, err := LoadDSparkStages(dsparkDir(t, drop("mtp.2.confidence_head.proj.weight"))); err != nil || st.Confidence != nil {
		t.Errorf("no confidence head: %v, confidence %d values", err, len(st.Confidence))
	}
}

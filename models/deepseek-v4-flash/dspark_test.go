package deepseekv4flash

import (
	"strings"
	"testing"
)

// TestConfigDSparkKeys: a DeepSeek-V4-Flash-DSpark config's dspark_* keys are read and
// checked (a bad value is refused naming its key), and a well-formed one is still refused,
// saying what was read and that the V4 DSpark forward is not implemented.
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
		!strings.Contains(err.Error(), "not implemented") {
		t.Errorf("a well-formed DSpark config: err = %v, want the drafter described and refused as not implemented", err)
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

package weights

import (
	"errors"
	"testing"
)

const llama3 = `{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
  "hidden_size": 2048, "intermediate_size": 8192, "max_position_embeddings": 131072,
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "head_dim": 64, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": true,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "torch_dtype": "bfloat16", "vocab_size": 128256
}`

const qwen2 = `{
  "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "eos_token_id": 151645,
  "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
  "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 32768, "use_sliding_window": false,
  "tie_word_embeddings": true, "vocab_size": 151936, "head_dim": null, "rope_scaling": null
}`

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig([]byte(llama3))
	if err != nil {
		t.Fatal(err)
	}
	if c.Architecture() != "LlamaForCausalLM" || c.HeadDim != 64 || c.NumKeyValueHeads != 8 || !c.TieWordEmbeddings {
		t.Errorf("llama3 parsed as %+v", c)
	}
	if len(c.EOSTokenID) != 3 || c.EOSTokenID[2] != 128009 || c.BOSTokenID[0] != 128000 {
		t.Errorf("token ids: bos %v eos %v", c.BOSTokenID, c.EOSTokenID)
	}
	if c.RopeScaling.Kind() != "llama3" || c.RopeScaling.Factor != 32 || c.RopeTheta != 500000 {
		t.Errorf("rope: %+v theta %g", c.RopeScaling, c.RopeTheta)
	}
	q, err := ParseConfig([]byte(qwen2))
	if err != nil {
		t.Fatal(err)
	}
	if q.HeadDim != 64 || q.RopeScaling.Kind() != "default" || q.UseSlidingWindow || q.EOSTokenID[0] != 151645 {
		t.Errorf("qwen2 parsed as %+v", q)
	}
	if _, ok := q.Raw["sliding_window"]; !ok {
		t.Error("Raw lost sliding_window")
	}
	v5, err := ParseConfig([]byte(`{"vocab_size":8,"hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"rope_parameters":{"rope_type":"default","rope_theta":1e6}}`))
	if err != nil || v5.RopeTheta != 1e6 || v5.NumKeyValueHeads != 2 || v5.HeadDim != 4 {
		t.Errorf("rope_parameters config: %+v, %v", v5, err)
	}
	// As in transformers, the rope dict's rope_theta wins over a top-level one.
	both, err := ParseConfig([]byte(`{"vocab_size":8,"hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"rope_theta":10000,"rope_parameters":{"rope_type":"default","rope_theta":1e6}}`))
	if err != nil || both.RopeTheta != 1e6 {
		t.Errorf("rope_theta beside rope_parameters.rope_theta: %+v, %v", both, err)
	}
}

func TestParseConfigErrors(t *testing.T) {
	for name, js := range map[string]string{
		"not json":     `{"hidden_size": `,
		"missing dims": `{"architectures":["LlamaForCausalLM"]}`,
		"bad gqa":      `{"vocab_size":8,"hidden_size":12,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":3,"num_key_value_heads":2}`,
		"string vocab": `{"vocab_size":"8","hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2}`,
		"odd head_dim": `{"vocab_size":8,"hidden_size":6,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2}`,
		"bad eos":      `{"vocab_size":8,"hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"eos_token_id":"x"}`,
	} {
		if _, err := ParseConfig([]byte(js)); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: err = %v, want ErrFormat", name, err)
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(llama3))
	f.Add([]byte(qwen2))
	f.Add([]byte(`{"vocab_size":8,"hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2,"rope_parameters":{"rope_type":"default","rope_theta":1e6}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig(b)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not match ErrFormat", err)
			}
			return
		}
		if c.NumAttentionHeads%c.NumKeyValueHeads != 0 || c.HeadDim <= 0 || c.HeadDim%2 != 0 {
			t.Fatalf("accepted inconsistent dimensions: %+v", c)
		}
	})
}

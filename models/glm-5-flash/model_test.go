package glm5flash

import (
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// tinyConfigJSON is a small DeepSeek-V4 crossing every layer kind: sliding, CSA (ratio 4)
// and HCA (ratio 8), hash and learned routing, an indexer whose top-k cuts.
const tinyConfigJSON = `{
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
  "vocab_size": 96, "hidden_size": 32, "moe_intermediate_size": 16, "num_hidden_layers": 4,
  "num_attention_heads": 4, "head_dim": 16, "q_lora_rank": 16, "num_experts_per_tok": 2,
  "n_routed_experts": 4, "o_groups": 2, "o_lora_rank": 8, "index_n_heads": 8,
  "index_head_dim": 8, "index_topk": 3, "sliding_window": 8, "hc_mult": 2,
  "partial_rotary_factor": 0.5, "swiglu_limit": 1.0, "max_position_embeddings": 512,
  "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention", "compressed_sparse_attention"],
  "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
  "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"]
}`

func tinyConfig(t testing.TB) *Config {
	t.Helper()
	c, err := ParseConfig([]byte(tinyConfigJSON))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func tinyModel(t testing.TB) *Model {
	t.Helper()
	c := tinyConfig(t)
	m, err := NewModel(c, RandomWeights(c, 7, true), 512)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// testRunner is the runner the conformance suite (conformance_test.go) drives: the
// GLM-5.3-Flash text runner on kvslab pages (textrunner_test.go).
func testRunner(t testing.TB) (engine.Runner, *kvslab.Pool) {
	t.Helper()
	return tinyTextRunner(t)
}

// TestChunkedEqualsOneShot checks, on random weights, that the forward gives the same
// logits whether a sequence comes in one prefill, in chunks that close compression
// windows inside and across chunk boundaries, token by token, or batched with another
// sequence of a different length.
func TestChunkedEqualsOneShot(t *testing.T) {
	m := tinyModel(t)
	toks := make([]int32, 90)
	for i := range toks {
		toks[i] = int32((i*37 + 11) % m.Config.VocabSize)
	}
	want, wantStreams := runChunks(t, m, toks, []int{len(toks)})
	for _, chunks := range [][]int{{1, 2, 3, 5, 7, 11, 13, 17, 31}, {45, 45}, ones(len(toks))} {
		got, streams := runChunks(t, m, toks, chunks)
		if d, at := runnertest.MaxAbsDiff(got, want); d > 1e-5 {
			t.Errorf("chunks %v: logits differ from one prefill by %g at row %d", chunks, d, at/m.Config.VocabSize)
		}
		if d, _ := runnertest.MaxAbsDiff(streams, wantStreams); d > 1e-5 {
			t.Errorf("chunks %v: streams differ from one prefill by %g", chunks, d)
		}
	}
	a, b := m.NewSeqState(), m.NewSeqState()
	other := toks[:50]
	var gotA []float32
	for i := 0; i < len(toks); i += 10 {
		chunks := []Chunk{{State: a, Tokens: toks[i : i+10]}}
		if i < len(other) {
			chunks = append([]Chunk{{State: b, Tokens: other[i : i+5]}}, chunks...)
		}
		l, _, err := m.Forward(chunks)
		if err != nil {
			t.Fatal(err)
		}
		if len(chunks) == 2 {
			l = l[5*m.Config.VocabSize:]
		}
		gotA = append(gotA, l...)
	}
	if d, at := runnertest.MaxAbsDiff(gotA, want); d > 1e-5 {
		t.Errorf("batched with another sequence: logits differ by %g at row %d", d, at/m.Config.VocabSize)
	}
	if m.MinTopKMargin < 1e-5 {
		t.Errorf("indexer top-k margin %g: the test data has near ties", m.MinTopKMargin)
	}
}

// TestForwardRefusals checks the forward's input errors.
func TestForwardRefusals(t *testing.T) {
	m := tinyModel(t)
	if _, _, err := m.Forward([]Chunk{{State: m.NewSeqState(), Tokens: []int32{int32(m.Config.VocabSize)}}}); err == nil {
		t.Error("a token id outside the vocabulary was accepted")
	}
	if _, _, err := m.Forward([]Chunk{{Tokens: []int32{1}}}); err == nil {
		t.Error("a chunk without state was accepted")
	}
	st := m.NewSeqState()
	st.Len = m.MaxContext()
	if _, _, err := m.Forward([]Chunk{{State: st, Tokens: []int32{1}}}); err == nil {
		t.Error("a position beyond the context was accepted")
	}
}

package glmdemo

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"sync"
	"testing"
)

// BenchmarkTextPrefill runs the "module" golden (200 tokens) one-shot; with
// -cpuprofile it gives the GEMM share of a prefill.
func BenchmarkTextPrefill(b *testing.B) {
	benchText(b, 0)
}

// BenchmarkTextDecode decodes one token after the golden's 199-token prefix.
func BenchmarkTextDecode(b *testing.B) {
	benchText(b, 1)
}

func benchText(b *testing.B, decode int) {
	dir := filepath.Join("testdata", "parity", "module")
	m, err := LoadTextModel(dir)
	if err != nil {
		b.Skip(err)
	}
	toks, _ := readGLMGolden(b, dir, m.Config.VocabSize)
	pre := m.NewTextState()
	if decode > 0 {
		if _, err := m.Forward(pre, toks[:len(toks)-decode]); err != nil {
			b.Fatal(err)
		}
	}
	feed := toks
	if decode > 0 {
		feed = toks[len(toks)-decode:]
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		st := pre.clone() // the state's copy is setup, not the step
		b.StartTimer()
		if _, err := m.ForwardRows(st, feed, []int{len(feed) - 1}); err != nil {
			b.Fatal(err)
		}
	}
}

// clone deep-copies a state made by NewTextState.
func (s *TextState) clone() *TextState {
	out := &TextState{Len: s.Len, BlockTokens: s.BlockTokens, Layers: make([]TextLayerState, len(s.Layers))}
	cp := func(r Rows) Rows {
		if g, ok := r.(*growRows); ok {
			return &growRows{dim: g.dim, data: append([]float32(nil), g.data...)}
		}
		return r
	}
	for i, l := range s.Layers {
		out.Layers[i] = TextLayerState{Conv: append([]float32(nil), l.Conv...), Recurrent: append([]float32(nil), l.Recurrent...),
			Latent: cp(l.Latent), IdxKey: cp(l.IdxKey), IdxGate: cp(l.IdxGate), Pools: cp(l.Pools)}
	}
	return out
}

// BenchmarkTextVerify feeds the last 4 golden tokens after the rest (a verify step of one
// token and 3 drafts), its KDA layers token by token keeping each state as the drafting
// runner does: compare with 4 × BenchmarkTextDecode.
func BenchmarkTextVerify(b *testing.B) {
	dir := filepath.Join("testdata", "parity", "module")
	m, err := LoadTextModel(dir)
	if err != nil {
		b.Skip(err)
	}
	toks, _ := readGLMGolden(b, dir, m.Config.VocabSize)
	pre := m.NewTextState()
	if _, err := m.Forward(pre, toks[:len(toks)-4]); err != nil {
		b.Fatal(err)
	}
	feed := toks[len(toks)-4:]
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		st := pre.clone()
		for i := range st.Layers {
			if ls := &st.Layers[i]; ls.Conv != nil {
				kept := make([]float32, 3*(len(ls.Conv)+len(ls.Recurrent)))
				ls.AfterToken = func(t int) {
					if t < 3 {
						copy(kept[t*(len(ls.Conv)+len(ls.Recurrent)):], ls.Conv)
						copy(kept[t*(len(ls.Conv)+len(ls.Recurrent))+len(ls.Conv):], ls.Recurrent)
					}
				}
			}
		}
		b.StartTimer()
		if _, err := m.ForwardRows(st, feed, []int{0, 1, 2, 3}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMTPDraft runs the MTP layer over one row after the golden's first 198 (the
// cost of one draft).
func BenchmarkMTPDraft(b *testing.B) {
	dir := filepath.Join("testdata", "parity", "module")
	m, err := LoadTextModel(dir)
	if err != nil {
		b.Skip(err)
	}
	toks, _ := readGLMGolden(b, dir, m.Config.VocabSize)
	_, hidden, err := m.ForwardHidden([]TextChunk{{State: m.NewTextState(), Tokens: toks}})
	if err != nil {
		b.Fatal(err)
	}
	D, n := m.Config.HiddenSize, len(toks)-2
	pre := m.NewMTPState()
	if _, _, err := m.MTPForward([]MTPChunk{{State: pre, Hidden: hidden[:n*D], Next: toks[1 : n+1], Rows: []int{}}}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		one := &TextState{Layers: []TextLayerState{*pre}}
		st := &one.clone().Layers[0]
		b.StartTimer()
		if _, _, err := m.MTPForward([]MTPChunk{{State: st, Pos0: n, Hidden: hidden[n*D : (n+1)*D], Next: toks[n+1 : n+2]}}); err != nil {
			b.Fatal(err)
		}
	}
}

// benchConfigJSON is the mid-size GLM-5.3-Flash the CPU-speed benchmarks run (fp32, random
// weights): KDA and MLA-DSA layers 2:1 (the indexer's top-k of 16 pools of 8 cuts at a
// 256-token prompt), a dense and sparse MLPs (16 experts top-4 with a shared one), 4 mHC
// streams. scripts/glm5-bench.sh runs the same config in transformers on torch's CPU path
// and passes it here through RESIN_GLM5_BENCH_CONFIG, so both sides read one file.
const benchConfigJSON = `{
  "architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next",
  "text_config": {"model_type": "glm5_next_text", "vocab_size": 8192, "hidden_size": 512,
    "intermediate_size": 1024, "moe_intermediate_size": 512, "num_hidden_layers": 6,
    "num_attention_heads": 8, "num_key_value_heads": 8, "q_lora_rank": 256, "kv_lora_rank": 256,
    "qk_nope_head_dim": 64, "v_head_dim": 64, "index_n_heads": 8, "index_head_dim": 64,
    "index_topk": 16, "index_kpool": 8, "linear_num_heads": 8, "linear_head_dim": 64,
    "n_routed_experts": 16, "num_experts_per_tok": 4, "n_shared_experts": 1, "n_group": 1,
    "topk_group": 1, "hc_mult": 4, "max_position_embeddings": 4096, "eos_token_id": 1,
    "pad_token_id": null,
    "layer_types": ["linear_attention", "linear_attention", "indexed_attention",
                    "linear_attention", "linear_attention", "indexed_attention"],
    "mlp_layer_types": ["dense", "sparse", "sparse", "sparse", "sparse", "sparse"]},
  "vision_config": {"model_type": "glm5_next_vision", "depth": 1},
  "tie_word_embeddings": false, "torch_dtype": "float32"
}`

// benchPrompt is the prompt length of BenchmarkGLMPrefill and the context
// BenchmarkGLMDecode starts from; benchBatches are the batch sizes of both.
const benchPrompt = 256

var benchBatches = []int{1, 4}

// benchSteps is the number of decode steps in one op of BenchmarkGLMDecode (-glm5.steps).
var benchSteps = flag.Int("glm5.steps", 16, "decode steps per op of BenchmarkGLMDecode")

var benchModel = sync.OnceValues(func() (*TextModel, error) {
	data := []byte(benchConfigJSON)
	if path := os.Getenv("RESIN_GLM5_BENCH_CONFIG"); path != "" {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return nil, err
		}
	}
	c, err := ParseTextConfig(data)
	if err != nil {
		return nil, err
	}
	return RandomTextModel(c, 1)
})

func loadBenchModel(b *testing.B) *TextModel {
	b.Helper()
	m, err := benchModel()
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// benchTokens is sequence j's token ids: deterministic and different per sequence (the
// same as scripts/glm5-bench.py's).
func benchTokens(m *TextModel, j, n int) []int32 {
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = int32((i*7919 + j*104729 + 3) % m.Config.VocabSize)
	}
	return toks
}

// BenchmarkGLMPrefill measures prefill of batch sequences of benchPrompt tokens each in one
// forward call (logits of every row, as transformers computes them) on the mid-size
// config; tok/s counts prompt tokens.
func BenchmarkGLMPrefill(b *testing.B) {
	for _, batch := range benchBatches {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			m := loadBenchModel(b)
			chunks := make([]TextChunk, batch)
			for j := range chunks {
				chunks[j].Tokens = benchTokens(m, j, benchPrompt)
			}
			b.ReportAllocs()
			b.ResetTimer()
			profiled("prefill", batch, func() {
				for range b.N {
					for j := range chunks {
						chunks[j].State = m.NewTextState()
					}
					if _, err := m.ForwardBatch(chunks); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.ReportMetric(float64(b.N*batch*benchPrompt)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}

// BenchmarkGLMDecode measures decode of batch sequences from benchPrompt tokens of context
// on the mid-size config: an op is -glm5.steps forward calls of one token per sequence
// (logits of that row), from a fresh copy of the prefilled states (made and copied outside
// the timer); tok/s counts generated tokens.
func BenchmarkGLMDecode(b *testing.B) {
	for _, batch := range benchBatches {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			m := loadBenchModel(b)
			pre := make([]*TextState, batch)
			chunks := make([]TextChunk, batch)
			for j := range chunks {
				pre[j] = m.NewTextState()
				chunks[j] = TextChunk{State: pre[j], Tokens: benchTokens(m, j, benchPrompt), Rows: []int{}}
			}
			if _, err := m.ForwardBatch(chunks); err != nil {
				b.Fatal(err)
			}
			next := make([]int32, batch)
			for j := range chunks {
				chunks[j] = TextChunk{Tokens: next[j : j+1], Rows: []int{0}}
			}
			b.ReportAllocs()
			b.ResetTimer()
			profiled("decode", batch, func() {
				for range b.N {
					b.StopTimer()
					for j := range chunks {
						chunks[j].State = pre[j].clone()
					}
					b.StartTimer()
					for i := range *benchSteps {
						for j := range next {
							next[j] = int32((i*131 + j*31 + 5) % m.Config.VocabSize)
						}
						if _, err := m.ForwardBatch(chunks); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
			b.ReportMetric(float64(b.N*batch**benchSteps)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}

// profiled runs f with the CPU profile label bench=PHASE/BATCH (e.g. decode/4), which the
// goroutines it starts (gonum's parallel GEMM) inherit: `go tool pprof -tagfocus
// bench=decode/4` keeps that timed loop and leaves out the setup.
func profiled(phase string, batch int, f func()) {
	pprof.Do(context.Background(), pprof.Labels("bench", phase+"/"+strconv.Itoa(batch)), func(context.Context) { f() })
}

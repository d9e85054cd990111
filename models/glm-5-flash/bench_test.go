package glm5flash

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"sync"
	"testing"
)

// benchConfigJSON is the mid-size DeepSeek-V4 the CPU-speed benchmarks run (fp32, random
// weights): every layer kind (sliding, CSA ratio 4 with an indexer whose top-k cuts at a
// 512-token prompt, HCA ratio 32), hash and learned routing, 16 experts top-4 with a shared
// one. scripts/deepseek-v4-bench.sh runs the same config in transformers on torch's CPU
// path and passes it here through RESIN_V4_BENCH_CONFIG, so both sides read one file.
const benchConfigJSON = `{
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
  "vocab_size": 8192, "hidden_size": 512, "moe_intermediate_size": 512, "num_hidden_layers": 6,
  "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 128, "q_lora_rank": 256,
  "o_groups": 2, "o_lora_rank": 128, "n_routed_experts": 16, "num_experts_per_tok": 4,
  "n_shared_experts": 1, "index_n_heads": 8, "index_head_dim": 64, "index_topk": 32,
  "sliding_window": 128, "hc_mult": 4, "partial_rotary_factor": 0.5, "swiglu_limit": 10.0,
  "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                  "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"],
  "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 32},
  "mlp_layer_types": ["hash_moe", "moe", "moe", "moe", "moe", "moe"],
  "max_position_embeddings": 4096, "num_nextn_predict_layers": 0,
  "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": false, "torch_dtype": "float32"
}`

// benchPrompt is the prompt length of the prefill benchmarks and the context the decode
// benchmarks start from.
const benchPrompt = 512

var benchModel = sync.OnceValues(func() (*Model, error) {
	data := []byte(benchConfigJSON)
	if path := os.Getenv("RESIN_V4_BENCH_CONFIG"); path != "" {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return nil, err
		}
	}
	c, err := ParseConfig(data)
	if err != nil {
		return nil, err
	}
	return NewModel(c, RandomWeights(c, 1, false), c.MaxPositionEmbeddings)
})

func loadBenchModel(b *testing.B) *Model {
	b.Helper()
	m, err := benchModel()
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// benchTokens is sequence j's token ids: deterministic and different per sequence.
func benchTokens(m *Model, j, n int) []int32 {
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = int32((i*7919 + j*104729 + 3) % m.Config.VocabSize)
	}
	return toks
}

// BenchmarkV4Prefill measures prefill of batch sequences of benchPrompt tokens each, in one
// forward call, on the mid-size config; tok/s counts prompt tokens.
func BenchmarkV4Prefill(b *testing.B) {
	for _, batch := range []int{1, 8} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			m := loadBenchModel(b)
			chunks := make([]Chunk, batch)
			for j := range chunks {
				chunks[j].Tokens = benchTokens(m, j, benchPrompt)
			}
			b.ReportAllocs()
			b.ResetTimer()
			profiled("prefill", batch, func() {
				for range b.N {
					for j := range chunks {
						chunks[j].State = m.NewSeqState()
					}
					if _, _, err := m.Forward(chunks); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.ReportMetric(float64(b.N*batch*benchPrompt)/b.Elapsed().Seconds(), "tok/s")
			states := make([]*SeqState, batch)
			for j, ch := range chunks {
				states[j] = ch.State
			}
			prefilled.Store(batch, states)
		})
	}
}

// prefilled holds, per batch size, the states after a benchPrompt-token prefill (left by
// BenchmarkV4Prefill, or made by BenchmarkV4Decode), so that the decode benchmark's runs
// (b.N ramp-up, -count) clone them instead of paying for the prefill again.
var prefilled sync.Map // batch → []*SeqState

// benchSteps is the number of decode steps in one op of BenchmarkV4Decode (-v4.steps).
var benchSteps = flag.Int("v4.steps", 32, "decode steps per op of BenchmarkV4Decode")

// BenchmarkV4Decode measures decode of batch sequences from benchPrompt tokens of context
// on the mid-size config: an op is -v4.steps forward calls of one token per sequence, from
// a fresh copy of the prefilled states (copied outside the timer); tok/s counts generated
// tokens.
func BenchmarkV4Decode(b *testing.B) {
	for _, batch := range []int{1, 8} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			m := loadBenchModel(b)
			v, _ := prefilled.Load(batch)
			if v == nil {
				states := make([]*SeqState, batch)
				chunks := make([]Chunk, batch)
				for j := range chunks {
					states[j] = m.NewSeqState()
					chunks[j] = Chunk{State: states[j], Tokens: benchTokens(m, j, benchPrompt)}
				}
				if _, _, err := m.Forward(chunks); err != nil {
					b.Fatal(err)
				}
				prefilled.Store(batch, states)
				v = states
			}
			chunks := make([]Chunk, batch)
			next := make([]int32, batch)
			for j := range chunks {
				chunks[j].Tokens = next[j : j+1]
			}
			b.ReportAllocs()
			b.ResetTimer()
			profiled("decode", batch, func() {
				for range b.N {
					b.StopTimer()
					for j, st := range v.([]*SeqState) {
						chunks[j].State = cloneState(st)
					}
					b.StartTimer()
					for i := range *benchSteps {
						for j := range next {
							next[j] = int32((i*131 + j*31 + 5) % m.Config.VocabSize)
						}
						if _, _, err := m.Forward(chunks); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
			b.ReportMetric(float64(b.N*batch**benchSteps)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}

// profiled runs f with the CPU profile label bench=PHASE/BATCH (e.g. decode/8), which
// the goroutines it starts (gonum's parallel GEMM) inherit: `go tool pprof -tagfocus
// bench=decode/8` keeps that timed loop and leaves out the setup.
func profiled(phase string, batch int, f func()) {
	pprof.Do(context.Background(), pprof.Labels("bench", phase+"/"+strconv.Itoa(batch)), func(context.Context) { f() })
}

// cloneState deep-copies a sequence state made by NewSeqState (Go-memory rows).
func cloneState(s *SeqState) *SeqState {
	rows := func(r Rows) Rows {
		sr := r.(*sliceRows)
		return &sliceRows{dim: sr.dim, start: sr.start, data: append([]float32(nil), sr.data...)}
	}
	comp := func(c *CompressorState) *CompressorState {
		if c == nil {
			return nil
		}
		d := *c
		d.PendingKV = append([]float32(nil), c.PendingKV...)
		d.PendingGate = append([]float32(nil), c.PendingGate...)
		d.PrevKV = append([]float32(nil), c.PrevKV...)
		d.PrevGate = append([]float32(nil), c.PrevGate...)
		d.Entries = rows(c.Entries)
		return &d
	}
	out := &SeqState{Len: s.Len, Layers: make([]LayerState, len(s.Layers))}
	for i, l := range s.Layers {
		out.Layers[i] = LayerState{Window: rows(l.Window), Compressor: comp(l.Compressor), Indexer: comp(l.Indexer)}
	}
	return out
}

package glmdemo

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// tinyTextConfigJSON is a small GLM-5.3-Flash crossing every path: KDA and MLA-DSA layers,
// a shared indexer, pools of 4 (8-token blocks), an indexer top-k that cuts (2 pools),
// dense and sparse MLPs with grouped routing.
const tinyTextConfigJSON = `{
  "architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next",
  "text_config": {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 48,
    "moe_intermediate_size": 16, "num_hidden_layers": 5, "num_attention_heads": 2,
    "num_key_value_heads": 2, "q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
    "v_head_dim": 8, "index_n_heads": 4, "index_head_dim": 8, "index_topk": 8, "index_kpool": 4,
    "linear_num_heads": 2, "linear_head_dim": 8, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "n_group": 2, "topk_group": 1, "hc_mult": 2, "swiglu_limit": 1.0, "max_position_embeddings": 512,
    "eos_token_id": 1, "pad_token_id": null,
    "layer_types": ["linear_attention", "indexed_attention", "indexed_attention", "linear_attention", "indexed_attention"],
    "indexer_types": ["full", "full", "shared", "full", "full"],
    "mlp_layer_types": ["dense", "sparse", "sparse", "dense", "sparse"]},
  "vision_config": {"depth": 1}
}`

func tinyTextModel(t testing.TB) *TextModel {
	t.Helper()
	c, err := ParseTextConfig([]byte(tinyTextConfigJSON))
	if err != nil {
		t.Fatal(err)
	}
	m, err := RandomTextModel(c, 7)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func tinyTextRunner(t testing.TB) (*TextRunner, *kvslab.Pool) {
	t.Helper()
	r := NewTextRunner(tinyTextModel(t), 8, 512)
	pool, err := r.NewPool(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	return r, pool
}

// TestPagedTextParity runs the golden checkpoints through the runner's kvslab-backed state
// (8-token pages; KDA checkpoints at block ends): in chunks and decode steps, and a second
// sequence that resumes from the prefix cache through a recurrent checkpoint, at a block
// end and, for a prompt whose shared part ends between checkpoints, at the last one
// before it; every row within glmParityTol of transformers.
func TestPagedTextParity(t *testing.T) {
	for _, dir := range glmParityCases(t) {
		m, err := LoadTextModel(dir)
		if err != nil {
			t.Fatal(err)
		}
		toks, want := readGLMGolden(t, dir, m.Config.VocabSize)
		V := m.Config.VocabSize
		r := NewTextRunner(m, 8, 512)
		pool, err := r.NewPool(64 << 20)
		if err != nil {
			t.Fatal(err)
		}
		check := func(name string, got []float32, from int) {
			if d, at := runnertest.MaxAbsDiff(got, want[from*V:(from+len(got)/V)*V]); !(d <= glmParityTol) {
				t.Errorf("%s: max |Δ| %g at row %d", name, d, from+at/V)
			}
		}
		// A: prefill in uneven chunks, then decode; commit so its blocks are cached.
		a := runnertest.OpenSeq(t, pool, toks)
		got := runStepsText(t, r, pool, a, []int{13, 27, 3, 1, 1})
		check("paged prefill+decode", got, 0)
		// B: the same first 61 tokens then 2 others: hits the cache through a checkpoint.
		for _, cut := range []int{65, 61} {
			id, hit, err := pool.Open(toks[:cut-1])
			if err != nil {
				t.Fatal(err)
			}
			if hit == 0 || hit%8 != 0 {
				t.Fatalf("cut %d: prefix hit of %d tokens", cut, hit)
			}
			b := &runnertest.Seq{ID: id, Tokens: toks[:cut+10], Computed: hit}
			got := runStepsText(t, r, pool, b, []int{5})
			check("after a prefix hit", got, hit)
			t.Logf("cut %d: resumed at %d from a KDA checkpoint", cut, hit)
		}
		// C: a one-step prefill of all the tokens in a fresh pool keeps only the last
		// textCheckpoints block-end checkpoints (176, 184, 192, 200 with 8-token blocks); a
		// prompt sharing 190 tokens resumes from the one at 184 (the blocks before have no
		// KDA checkpoint, the one at 192 is past the shared part) and recomputes the rest.
		pool2, err := r.NewPool(64 << 20)
		if err != nil {
			t.Fatal(err)
		}
		c := runnertest.OpenSeq(t, pool2, toks)
		runStepsText(t, r, pool2, c, []int{len(toks)})
		id, hit, err := pool2.Open(toks[:190])
		if err != nil {
			t.Fatal(err)
		}
		if want := 184; len(toks) == 200 && textCheckpoints == 4 && hit != want {
			t.Errorf("sparse checkpoints: hit %d tokens, want %d", hit, want)
		}
		d := &runnertest.Seq{ID: id, Tokens: toks, Computed: hit}
		check("after a hit between sparse checkpoints", runStepsText(t, r, pool2, d, []int{3, 1}), hit)
		t.Logf("sparse checkpoints: resumed at %d", hit)
		if err := r.Bind(pool); err != nil { // leave r as it was
			t.Fatal(err)
		}
	}
}

// runStepsText feeds the rest of seq.Tokens in chunks of the given sizes (cycled),
// committing after each step as the engine does, and returns the logits of every fed row.
func runStepsText(t *testing.T, r *TextRunner, pool *kvslab.Pool, seq *runnertest.Seq, sizes []int) []float32 {
	t.Helper()
	V := r.Model.Config.VocabSize
	var out []float32
	for j := 0; seq.Computed < len(seq.Tokens); j++ {
		n := min(sizes[j%len(sizes)], len(seq.Tokens)-seq.Computed)
		p := runnertest.Plan(t, pool, []*runnertest.Seq{seq}, []int{n}, true)
		logits := make([]float32, len(p.LogitsIndices)*V)
		if err := r.forward(p, logits); err != nil {
			t.Fatal(err)
		}
		if err := pool.Commit(seq.ID, seq.Tokens[:seq.Computed]); err != nil {
			t.Fatal(err)
		}
		out = append(out, logits...)
	}
	return out
}

// TestTextRunnerExecutes runs one plan through cpurunner's Execute (sampling included).
func TestTextRunnerExecutes(t *testing.T) {
	r, pool := tinyTextRunner(t)
	s := runnertest.OpenSeq(t, pool, runnertest.Prompt(20, 96, 1))
	res, err := r.Execute(context.Background(), runnertest.Plan(t, pool, []*runnertest.Seq{s}, []int{20}, false))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Tokens) != 1 {
		t.Fatalf("%d tokens sampled", len(res.Tokens))
	}
}

// TestVisionPromptRefusedAlone submits, through the engine, a prompt holding an image
// placeholder beside a text prompt: the first is refused at Submit with
// ErrInvalidRequest saying vision inputs are not supported, the second runs to its end.
func TestVisionPromptRefusedAlone(t *testing.T) {
	cfg := strings.Replace(tinyTextConfigJSON, `"vision_config"`, `"image_token_id": 90, "video_token_id": 91, "vision_config"`, 1)
	c, err := ParseTextConfig([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	m, err := RandomTextModel(c, 7)
	if err != nil {
		t.Fatal(err)
	}
	r := NewTextRunner(m, 8, 512)
	pool, err := r.NewPool(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(r, engine.Config{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { cancel(); <-done }()
	sp := engine.SamplingParams{MaxTokens: 5, IgnoreEOS: true}
	text, err := e.Submit(ctx, engine.Request{Prompt: runnertest.Prompt(12, 89, 3), Sampling: sp})
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range []int32{90, 91} {
		_, err = e.Submit(ctx, engine.Request{Prompt: []int32{4, 5, tok, 6}, Sampling: sp})
		if !errors.Is(err, engine.ErrInvalidRequest) || !strings.Contains(err.Error(), "vision inputs are not supported") ||
			!strings.Contains(err.Error(), "position 2") {
			t.Fatalf("prompt with placeholder %d: %v, want ErrInvalidRequest naming it", tok, err)
		}
	}
	toks, ev, err := text.Collect(ctx)
	if err != nil || ev.Finish != engine.FinishLength || len(toks) != 5 {
		t.Fatalf("the text request: %d tokens, finish %v (%v, %v)", len(toks), ev.Finish, ev.Err, err)
	}
}

// TestRealSizePool checks that the pool of GLM-5.3-Flash's own dimensions (transformers'
// defaults: 34 KDA layers whose state is 153 MB a sequence, 11 MLA-DSA layers whose pooled
// keys take 5.6 kB a block) can be laid out, with and without the MTP layer's state, by the
// configuration NewPool hands kvslab (engine.NewHostPool: no slab size, kvslab's default).
// Sixteen KDA state pages would hold more pool-key pages than a page id addresses, so the
// default slab must come out smaller than that and still hold a state page. Sized, and the
// pool built over an arena that holds no memory.
func TestRealSizePool(t *testing.T) {
	c, err := ParseTextConfig([]byte(`{"model_type": "glm5_next", "text_config": {"num_hidden_layers": 45}}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, mtp := range []bool{false, true} {
		cfg := kvslab.Config{Groups: newTextLayout(c, TextPageTokens(c, 0), mtp).groups}
		z, err := kvslab.Size(cfg, 16<<30, 1)
		if err != nil {
			t.Fatalf("mtp %v: %v", mtp, err)
		}
		var largest int64
		for _, g := range cfg.Groups {
			largest = max(largest, g.PageBytes())
		}
		if z.SlabBytes >= kvslab.DefaultSlabPages*largest {
			t.Errorf("mtp %v: slab of %d bytes, want fewer than %d state pages of %d bytes (the layout this test is for)",
				mtp, z.SlabBytes, kvslab.DefaultSlabPages, largest)
		}
		for _, g := range z.Groups {
			if g.PagesPerSlab < 1 || g.PagesPerSlab > kvslab.SlotMask+1 {
				t.Errorf("mtp %v: group %q has %d pages a slab, want 1 to %d", mtp, g.Name, g.PagesPerSlab, kvslab.SlotMask+1)
			}
		}
		if want := newTextRunner(&TextModel{Config: c}, 0, 0, 0).MaxContext; z.ContextTokens < want {
			t.Errorf("mtp %v: 16 GiB holds one sequence of %d tokens, want the runner's %d", mtp, z.ContextTokens, want)
		}
		pool, err := kvslab.New(cfg, sizeOnlyArena(16<<30))
		if err != nil {
			t.Fatalf("mtp %v: pool of 16 GiB: %v", mtp, err)
		}
		if pool.SlabBytes() != z.SlabBytes || pool.Slabs() != z.Slabs {
			t.Errorf("mtp %v: pool of %d slabs of %d bytes, sized %d of %d", mtp, pool.Slabs(), pool.SlabBytes(), z.Slabs, z.SlabBytes)
		}
		t.Logf("mtp %v: %v", mtp, z)
	}
}

// sizeOnlyArena is a kvslab.Arena that reports a size and holds no memory (kvslab.New reads
// only its size), for pools too large to allocate in a test.
type sizeOnlyArena int64

func (a sizeOnlyArena) Size() int64 { return int64(a) }
func (a sizeOnlyArena) Copy(dst, src, n int64) error {
	return errors.New("sizeOnlyArena: no memory")
}

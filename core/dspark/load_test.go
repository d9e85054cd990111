package dspark

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/weights"
)

// readConfig returns testdata/NAME/config.json as a map to edit.
func readConfig(t *testing.T, name string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestParseConfigRefuses(t *testing.T) {
	cases := []struct {
		name string
		edit func(m map[string]any)
		want string
	}{
		{"architecture", func(m map[string]any) { m["architectures"] = []string{"Qwen3ForCausalLM"} }, "architectures"},
		{"no taps", func(m map[string]any) { delete(m, "target_layer_ids") }, "target_layer_ids is missing"},
		{"no block", func(m map[string]any) { delete(m, "block_size") }, "block_size is missing"},
		{"zero block", func(m map[string]any) { m["block_size"] = 0 }, "block_size must be positive"},
		{"mask", func(m map[string]any) { m["mask_token_id"] = 32 }, "mask_token_id 32 outside"},
		{"no mask", func(m map[string]any) { delete(m, "mask_token_id") }, "mask_token_id is missing"},
		{"no rank", func(m map[string]any) { delete(m, "markov_rank") }, "markov_rank is missing"},
		{"head type", func(m map[string]any) { m["markov_head_type"] = "lstm" }, `markov_head_type "lstm"`},
		{"no head type", func(m map[string]any) { delete(m, "markov_head_type") }, "markov_head_type is missing"},
		{"no confidence flag", func(m map[string]any) { delete(m, "enable_confidence_head") }, "enable_confidence_head is missing"},
		{"no with_markov", func(m map[string]any) { delete(m, "confidence_head_with_markov") }, "confidence_head_with_markov is missing"},
		{"with_markov without head", func(m map[string]any) { m["markov_rank"] = 0 }, "needs a Markov head"},
		{"last layer tap", func(m map[string]any) { m["target_layer_ids"] = []int{-1, 3} }, "last target layer"},
		{"below -1", func(m map[string]any) { m["target_layer_ids"] = []int{-2} }, "target_layer_ids[0] = -2"},
		{"not increasing", func(m map[string]any) { m["target_layer_ids"] = []int{1, 1} }, "strictly increasing"},
		{"rope", func(m map[string]any) {
			m["rope_parameters"] = map[string]any{"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}
		}, `rope type "yarn"`},
		{"sliding", func(m map[string]any) { m["layer_types"] = []string{"full_attention", "sliding_attention"} }, "layer_types[1]"},
		{"tied", func(m map[string]any) { m["tie_word_embeddings"] = true }, "tie_word_embeddings"},
		{"pruned vocab", func(m map[string]any) { m["draft_vocab_size"] = 16 }, "draft_vocab_size 16"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := readConfig(t, "vanilla")
			tc.edit(m)
			data, _ := json.Marshal(m)
			_, err := ParseConfig(data)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	m := readConfig(t, "vanilla")
	data, _ := json.Marshal(m)
	c, err := ParseConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	if c.BlockSize != 7 || c.MarkovHead != MarkovVanilla || !c.Confidence || !c.ConfidenceMarkov || c.MaskTokenID != 31 || c.NumTargetLayers != 4 {
		t.Fatalf("parsed %+v", c)
	}
}

func TestCheckTarget(t *testing.T) {
	c, err := LoadConfig("testdata/vanilla")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CheckTarget(32, 16, 4); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		vocab, hidden, layers int
		want                  string
	}{
		{33, 16, 4, "vocab_size 32 differs"},
		{32, 8, 4, "hidden_size 16 differs"},
		{32, 16, 5, "built for 4 target layers"},
	} {
		if err := c.CheckTarget(tc.vocab, tc.hidden, tc.layers); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckTarget(%d, %d, %d) = %v, want %q", tc.vocab, tc.hidden, tc.layers, err, tc.want)
		}
	}
	c.NumTargetLayers = 0 // a config that does not say: the tap on layer 2 is the last of 3
	if err := c.CheckTarget(32, 16, 3); err == nil || !strings.Contains(err.Error(), "cannot be tapped") {
		t.Errorf("a tap on the last layer: %v", err)
	}
}

// writeDrafter saves the vanilla drafter's config and the given tensors into a new dir.
func writeDrafter(t *testing.T, ts []weights.Tensor) string {
	t.Helper()
	dir := t.TempDir()
	data, err := os.ReadFile("testdata/vanilla/config.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := weights.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestLoadWeightsRefuses(t *testing.T) {
	c, err := LoadConfig("testdata/vanilla")
	if err != nil {
		t.Fatal(err)
	}
	ts, err := Tensors(c, RandomWeights(c, 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Load(writeDrafter(t, ts), 64); err != nil {
		t.Fatalf("random weights under DeepSpec's names: %v", err)
	}
	// A tensor dropped, one renamed with a model. prefix, one with the wrong shape.
	var dropped, prefixed []weights.Tensor
	for _, x := range ts {
		if x.Name != "markov_head.markov_w2.weight" {
			dropped = append(dropped, x)
		}
		if x.Name == "fc.weight" {
			x.Name = "model.fc.weight"
		}
		prefixed = append(prefixed, x)
	}
	if _, err := Load(writeDrafter(t, dropped), 64); err == nil || !strings.Contains(err.Error(), "missing tensors [markov_head.markov_w2.weight]") {
		t.Errorf("missing tensor: %v", err)
	}
	_, err = Load(writeDrafter(t, prefixed), 64)
	if err == nil || !strings.Contains(err.Error(), "unexpected tensors (not used by this config) [model.fc.weight]") || !strings.Contains(err.Error(), "missing tensors [fc.weight]") {
		t.Errorf("prefixed tensor: %v", err)
	}
	bad := append([]weights.Tensor(nil), ts...)
	for i, x := range bad {
		if x.Name == "hidden_norm.weight" {
			bad[i], _ = weights.NewTensor(x.Name, weights.F32, []int{8}, make([]float32, 8))
		}
	}
	if _, err := Load(writeDrafter(t, bad), 64); err == nil || !strings.Contains(err.Error(), "hidden_norm.weight") {
		t.Errorf("wrong shape: %v", err)
	}
}

func TestFeatureTap(t *testing.T) {
	// A target of 3 rows, hidden 2: row r after layer l holds 10·(l+1) + r.
	x := func(l int) []float32 {
		v := make([]float32, 6)
		for r := range 3 {
			v[2*r], v[2*r+1] = float32(10*(l+1)+r), float32(10*(l+1)+r)
		}
		return v
	}
	tap := NewFeatureTap([]int{-1, 1}, []int32{2, 0}, 2)
	for l := -1; l < 3; l++ {
		if err := tap.Capture(l, x(l)); err != nil {
			t.Fatal(err)
		}
	}
	want := []float32{2, 2, 22, 22, 0, 0, 20, 20} // row 2: embeddings, layer 1; then row 0
	for i := range want {
		if tap.Features[i] != want[i] {
			t.Fatalf("features %v, want %v", tap.Features, want)
		}
	}
	var none *FeatureTap
	if err := none.Capture(0, x(0)); err != nil {
		t.Fatal(err)
	}
	tap.Rows = []int32{3}
	tap.Features = make([]float32, 4)
	if err := tap.Capture(1, x(1)); err == nil {
		t.Fatal("a row outside the target was captured")
	}
}

// TestContextTruncate checks that a context rolled back and extended again with the same
// features gives the same block as one built straight, and that MaxDrafts caps the drafts.
func TestContextTruncate(t *testing.T) {
	d, err := Load("testdata/rnn", 0)
	if err != nil {
		t.Fatal(err)
	}
	F := d.Config.FeatureDim()
	feats := make([]float32, 6*F)
	for i := range feats {
		feats[i] = float32((i*7)%11)/5 - 1
	}
	straight := d.NewContext()
	if err := d.Extend(straight, feats[:4*F], 4); err != nil {
		t.Fatal(err)
	}
	want, err := d.Block(straight, 3)
	if err != nil {
		t.Fatal(err)
	}
	rolled := d.NewContext()
	if err := d.Extend(rolled, feats, 6); err != nil {
		t.Fatal(err)
	}
	if err := rolled.Truncate(7); err == nil {
		t.Fatal("truncating past the context's length was accepted")
	}
	if err := rolled.Truncate(2); err != nil {
		t.Fatal(err)
	}
	if err := d.Extend(rolled, feats[2*F:4*F], 2); err != nil {
		t.Fatal(err)
	}
	got, err := d.Block(rolled, 3)
	if err != nil {
		t.Fatal(err)
	}
	if i, diff := maxDiff(got.Logits, want.Logits); diff != 0 {
		t.Fatalf("logits[%d] differ by %g after a rollback", i, diff)
	}
	p, err := d.Propose(got, Sampling{MaxDrafts: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Drafts) != 2 || len(p.Q) != 2*d.Config.Base.VocabSize || len(p.Chain) != d.Config.BlockSize {
		t.Fatalf("MaxDrafts 2: %d drafts, %d q values, %d draws", len(p.Drafts), len(p.Q), len(p.Chain))
	}
	if _, err := d.Propose(got, Sampling{Temperature: 1}); err == nil {
		t.Fatal("sampling without uniforms was accepted")
	}
}

// TestBlocksMatchesBlock: the blocks of three sequences of different context lengths in
// one Blocks call equal each one's Block, up to GEMM rounding.
func TestBlocksMatchesBlock(t *testing.T) {
	d, err := Load("testdata/gated", 0)
	if err != nil {
		t.Fatal(err)
	}
	F := d.Config.FeatureDim()
	var ctxs []*Context
	for i, n := range []int{3, 9, 1} {
		ctx := d.NewContext()
		feats := make([]float32, n*F)
		for j := range feats {
			feats[j] = float32((j*(i+3))%13)/6 - 1
		}
		if err := d.Extend(ctx, feats, n); err != nil {
			t.Fatal(err)
		}
		ctxs = append(ctxs, ctx)
	}
	anchors := []int32{4, 0, 30}
	got, err := d.Blocks(ctxs, anchors)
	if err != nil {
		t.Fatal(err)
	}
	for i, ctx := range ctxs {
		want, err := d.Block(ctx, anchors[i])
		if err != nil {
			t.Fatal(err)
		}
		if j, diff := maxDiff(got[i].Logits, want.Logits); diff > 1e-5 {
			t.Errorf("sequence %d: logit %d differs by %g between Blocks and Block", i, j, diff)
		}
		if got[i].Position != ctx.Len() || got[i].Anchor != anchors[i] {
			t.Errorf("sequence %d: block at %d anchored %d", i, got[i].Position, got[i].Anchor)
		}
	}
	if _, err := d.Blocks(ctxs, anchors[:2]); err == nil {
		t.Error("three contexts with two anchors were accepted")
	}
}

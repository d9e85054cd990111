package dspark

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// golden is testdata/golden.json, written by scripts/dspark_goldens.py: DeepSpec's drafting
// code on tiny random drafters for given target features, verification by verification.
type golden struct {
	Cases []struct {
		Drafter     string  `json:"drafter"`
		Temperature float32 `json:"temperature"`
		Threshold   float32 `json:"threshold"`
		Steps       []struct {
			Anchor         int32     `json:"anchor"`
			AnchorPosition int       `json:"anchor_position"`
			Features       []float32 `json:"features"` // the context rows inserted before this block
			Uniforms       []float64 `json:"uniforms"`
			Logits         []float32 `json:"logits"`     // [B, vocab] with the Markov bias
			Chain          []int32   `json:"chain"`      // all B draws
			Drafts         int       `json:"drafts"`     // after the confidence cut
			Confidence     []float32 `json:"confidence"` // [B] logits, null without the head
			Q              []float32 `json:"q"`          // [drafts, vocab] at temperature > 0
			Accepted       int       `json:"accepted"`
		} `json:"steps"`
	} `json:"cases"`
}

// goldenTol bounds |Go − torch| on logits, confidences and q: both run float32 weights,
// torch sums in float32, Go's attention in float64, over a 2-layer drafter.
const goldenTol = 2e-4

func TestGolden(t *testing.T) {
	data, err := os.ReadFile("testdata/golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Cases) == 0 {
		t.Fatal("no cases")
	}
	var cuts [3]int // zero, partial and full blocks seen
	for _, gc := range g.Cases {
		d, err := Load(filepath.Join("testdata", gc.Drafter), 0)
		if err != nil {
			t.Fatalf("%s: %v", gc.Drafter, err)
		}
		B, V := d.Config.BlockSize, d.Config.Base.VocabSize
		ctx := d.NewContext()
		for si, st := range gc.Steps {
			name := func() string {
				return gc.Drafter + " T=" + ftoa(gc.Temperature) + " cut=" + ftoa(gc.Threshold) + " step " + itoa(si)
			}
			rows := len(st.Features) / d.Config.FeatureDim()
			if err := d.Extend(ctx, st.Features, rows); err != nil {
				t.Fatalf("%s: %v", name(), err)
			}
			if ctx.Len() != st.AnchorPosition {
				t.Fatalf("%s: context holds %d positions, the anchor is at %d", name(), ctx.Len(), st.AnchorPosition)
			}
			blk, err := d.Block(ctx, st.Anchor)
			if err != nil {
				t.Fatalf("%s: %v", name(), err)
			}
			p, err := d.Propose(blk, Sampling{Temperature: gc.Temperature, Threshold: gc.Threshold, Uniforms: st.Uniforms})
			if err != nil {
				t.Fatalf("%s: %v", name(), err)
			}
			if i, diff := maxDiff(p.Logits, st.Logits); diff > goldenTol {
				t.Errorf("%s: logits[%d, %d] = %g, torch %g", name(), i/V, i%V, p.Logits[i], st.Logits[i])
			}
			if !slices.Equal(p.Chain, st.Chain) {
				t.Errorf("%s: draws %v, torch %v", name(), p.Chain, st.Chain)
			}
			if st.Confidence != nil {
				if i, diff := maxDiff(p.Confidence, st.Confidence); diff > goldenTol {
					t.Errorf("%s: confidence[%d] = %g, torch %g", name(), i, p.Confidence[i], st.Confidence[i])
				}
			} else if p.Confidence != nil {
				t.Errorf("%s: confidence without a confidence head", name())
			}
			if len(p.Drafts) != st.Drafts {
				t.Errorf("%s: %d drafts, torch %d", name(), len(p.Drafts), st.Drafts)
			}
			if st.Q != nil {
				if i, diff := maxDiff(p.Q, st.Q); diff > goldenTol {
					t.Errorf("%s: q[%d, %d] = %g, torch %g", name(), i/V, i%V, p.Q[i], st.Q[i])
				}
			} else {
				for i, dr := range p.Drafts { // greedy: one-hot at the draft
					if p.Q[i*V+int(dr)] != 1 || p.DraftProb(i) != 1 {
						t.Errorf("%s: greedy q of draft %d is not one-hot at it", name(), i)
					}
				}
			}
			switch {
			case st.Drafts == 0:
				cuts[0]++
			case st.Drafts < B:
				cuts[1]++
			default:
				cuts[2]++
			}
			// DeepSpec's cache keeps context K/V only: the block left it unchanged.
			if ctx.Len() != st.AnchorPosition {
				t.Fatalf("%s: the block changed the context to %d positions", name(), ctx.Len())
			}
		}
	}
	if cuts[0] == 0 || cuts[1] == 0 || cuts[2] == 0 {
		t.Errorf("the goldens should hold zero, partial and full blocks; got %v", cuts)
	}
}

func maxDiff(a, b []float32) (int, float64) {
	if len(a) != len(b) {
		return 0, math.Inf(1)
	}
	at, worst := 0, 0.0
	for i := range a {
		if d := math.Abs(float64(a[i] - b[i])); d > worst || math.IsNaN(d) {
			at, worst = i, d
		}
	}
	return at, worst
}

func ftoa(f float32) string { b, _ := json.Marshal(f); return string(b) }
func itoa(i int) string     { b, _ := json.Marshal(i); return string(b) }

// BenchmarkBlock is one block forward and proposal of the vanilla test drafter over a
// context of 48 positions.
func BenchmarkBlock(b *testing.B) {
	d, err := Load("testdata/vanilla", 64)
	if err != nil {
		b.Fatal(err)
	}
	ctx := d.NewContext()
	feats := make([]float32, 48*d.Config.FeatureDim())
	for i := range feats {
		feats[i] = float32(i%7) / 7
	}
	if err := d.Extend(ctx, feats, 48); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		blk, err := d.Block(ctx, 3)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := d.Propose(blk, Sampling{}); err != nil {
			b.Fatal(err)
		}
	}
}

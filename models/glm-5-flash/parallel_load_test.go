package glm5flash

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/resin-llm/resin/core/weights"
)

// recordingSource records every tensor read through it, to be saved as a checkpoint.
type recordingSource struct {
	tensorSource
	got map[string]weights.Tensor
	err error
}

func (s *recordingSource) Float32(name string, shape ...int) ([]float32, error) {
	v, err := s.tensorSource.Float32(name, shape...)
	if err == nil {
		t, terr := weights.NewTensor(name, weights.F32, shape, v)
		if terr != nil && s.err == nil {
			s.err = terr
		}
		s.got[name] = t
	}
	return v, err
}

// TestLoadShardReadsItsSlices: under TP=2 (and TP=2 × EP=2, TP=2 × EP=4: the tp rank's
// slices, the ep rank's whole experts) a rank's shard read from an
// f32 checkpoint (loadTextShard with the rank's part) reads fewer bytes than the whole
// model (KDA's and MLA's split projections, the dense and shared MLPs and the vocabulary
// by their rows or columns alone), and equals ShardTextWeights' cut in every field; a GPU
// rank's part (its gpurunner.VocabParallel rows) read equals gpuRankWeights' cut.
func TestLoadShardReadsItsSlices(t *testing.T) {
	for _, fused := range []bool{false, true} {
		loadShardReadsItsSlices(t, fused)
	}
}

// loadShardReadsItsSlices is the test on a checkpoint with per-expert tensors, or with
// fused ones (experts.gate_up_proj, experts.down_proj: read whole, cut by the loader).
func loadShardReadsItsSlices(t *testing.T, fused bool) {
	m := tinyTextModel(t)
	c := m.Config
	names := map[string][]float32{}
	for i, ly := range m.W.layers {
		if ly.moe == nil {
			continue
		}
		F, D := c.MoEIntermediateSize, c.HiddenSize
		if fused {
			names[fmt.Sprintf("%slayers.%d.mlp.experts.gate_up_proj", TextPrefix, i)] = ly.moe.gateUp
			names[fmt.Sprintf("%slayers.%d.mlp.experts.down_proj", TextPrefix, i)] = ly.moe.down
			continue
		}
		for e := range c.NRoutedExperts {
			p := fmt.Sprintf("%slayers.%d.mlp.experts.%d.", TextPrefix, i, e)
			gu := ly.moe.gateUp[e*2*F*D : (e+1)*2*F*D]
			names[p+"gate_proj.weight"] = gu[:F*D]
			names[p+"up_proj.weight"] = gu[F*D:]
			names[p+"down_proj.weight"] = ly.moe.down[e*D*F : (e+1)*D*F]
		}
	}
	rec := &recordingSource{tensorSource: mapSource{m: names, fallback: randomSource{rand.New(rand.NewPCG(7, 7))}, layers: c.NumHiddenLayers}, got: map[string]weights.Tensor{}}
	whole, _, err := loadTextWeights(rec, c)
	if err != nil || rec.err != nil {
		t.Fatal(err, rec.err)
	}
	var ts []weights.Tensor
	for _, x := range rec.got {
		ts = append(ts, x)
	}
	dir := t.TempDir()
	if err := weights.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(tinyTextConfigJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	open := func() *weights.Checkpoint {
		ck, err := weights.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		ck.SetProgress(nil)
		return ck
	}
	ck := open()
	if _, _, err := loadTextWeights(ck, c); err != nil {
		t.Fatal(err)
	}
	all := ck.BytesRead()
	ck.Close()
	for _, l := range []Layout{{TP: 2}, {TP: 2, EP: 2}, {TP: 2, EP: 4}} {
		for rank := range l.Size() {
			p := rankPart(c, l, rank)
			ck := open()
			w, err := loadTextShard(ck, c, &[2]int{p.expLo, p.expHi}, &p)
			read := ck.BytesRead()
			ck.Close()
			if err != nil {
				t.Fatalf("%+v rank %d: %v", l, rank, err)
			}
			got := p.cut(c, w, p.expLo, true)
			want, err := ShardTextWeights(c, whole, l, rank)
			if err != nil {
				t.Fatal(err)
			}
			if read >= all {
				t.Fatalf("%+v rank %d read %d bytes, the whole model %d", l, rank, read, all)
			}
			for i := range want.layers {
				if !reflect.DeepEqual(got.layers[i], want.layers[i]) {
					t.Fatalf("fused %v, %+v rank %d layer %d differs from ShardTextWeights'", fused, l, rank, i)
				}
			}
			if !reflect.DeepEqual(got.embed, want.embed) || !reflect.DeepEqual(got.lmHead, want.lmHead) || !reflect.DeepEqual(got.norm, want.norm) {
				t.Fatalf("%+v rank %d: embedding, head or norm differs", l, rank)
			}
			t.Logf("fused %v, %+v rank %d: %d of %d bytes", fused, l, rank, read, all)
			if l.TP > 1 && l.EP > 1 && l.TP != l.EP {
				continue // the GPU layout runs equal sizes only
			}
			// A GPU rank's part (gpuRankPart: gpurunner.VocabParallel's vocabulary shard)
			// read from the checkpoint equals the one cut from the whole model.
			gp := gpuRankPart(c, l, rank)
			gw, err := loadPartWeights(dir, c, 0, gp, nil)
			if err != nil {
				t.Fatal(err)
			}
			gwant := gpuRankWeights(c, whole, l, rank)
			D := c.HiddenSize
			if !reflect.DeepEqual(gw.layers, gwant.layers) || !reflect.DeepEqual(gw.embed, gwant.embed) || !reflect.DeepEqual(gw.lmHead, gwant.lmHead) ||
				!reflect.DeepEqual(gw.embed, whole.embed[gp.vocabLo*D:gp.vocabHi*D]) {
				t.Fatalf("fused %v, %+v rank %d: the GPU rank's weights read differ from the cut ones (or from its vocabulary rows [%d, %d))", fused, l, rank, gp.vocabLo, gp.vocabHi)
			}
		}
	}
}

package deepseekv4flash

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/weights"
)

// TestLoadShardReadsItsSlices: under TP=2 (and TP=2 × EP=2) a rank's LoadShard from an
// f32 checkpoint reads fewer bytes than the whole model (the attention's split tensors,
// the shared experts and the vocabulary by their rows or columns alone), and the weights
// it returns equal ShardWeights' cut of the whole model in every field.
func TestLoadShardReadsItsSlices(t *testing.T) {
	c := tinyConfig(t)
	w := RandomWeights(c, 7, false)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(tinyConfigJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, form := range []NameForm{UpstreamNames, ModuleNames} {
		sub := filepath.Join(dir, form.String())
		if err := w.Save(c, sub, weights.F32, form); err != nil {
			t.Fatal(err)
		}
		open := func() *weights.Checkpoint {
			ck, err := weights.Open(sub)
			if err != nil {
				t.Fatal(err)
			}
			ck.SetProgress(nil)
			return ck
		}
		ck := open()
		if _, err := LoadWeights(c, ck); err != nil {
			t.Fatal(err)
		}
		whole := ck.BytesRead()
		ck.Close()
		for _, l := range []Layout{{TP: 2}, {TP: 2, EP: 2}} {
			for rank := range l.Size() {
				ck := open()
				got, err := LoadShard(c, ck, l, rank)
				read := ck.BytesRead()
				ck.Close()
				if err != nil {
					t.Fatalf("%s form, %+v rank %d: %v", form, l, rank, err)
				}
				if read >= whole {
					t.Fatalf("%s form, %+v rank %d read %d bytes, the whole model %d", form, l, rank, read, whole)
				}
				want, err := ShardWeights(c, w, l, rank)
				if err != nil {
					t.Fatal(err)
				}
				for i := range want.Layers {
					if !reflect.DeepEqual(got.Layers[i], want.Layers[i]) {
						t.Fatalf("%s form, %+v rank %d layer %d differs from ShardWeights'", form, l, rank, i)
					}
				}
				if !reflect.DeepEqual(got.Embed, want.Embed) || !reflect.DeepEqual(got.Head, want.Head) || !reflect.DeepEqual(got.Norm, want.Norm) {
					t.Fatalf("%s form, %+v rank %d: embedding, head or norm differs", form, l, rank)
				}
				t.Logf("%s form, %+v rank %d: %d of %d bytes", form, l, rank, read, whole)
			}
		}
	}
}

// TestLoadShardFP8: with layer 1's q_b (split by rows) and o_b (by columns) stored as
// float8 e4m3 in 3×3 blocks (ranges that cut blocks), each TP=2 rank's LoadShard equals
// ShardWeights' cut of the whole dequantized model bit for bit and reads less than it.
func TestLoadShardFP8(t *testing.T) {
	cfgJSON := strings.Replace(tinyConfigJSON, `"model_type": "deepseek_v4",`,
		`"model_type": "deepseek_v4", "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [3, 3]},`, 1)
	c, err := ParseConfig([]byte(cfgJSON))
	if err != nil {
		t.Fatal(err)
	}
	w := RandomWeights(c, 3, false)
	ts, err := w.Tensors(c, weights.F32, UpstreamNames)
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range ts {
		if x.Name != "layers.1.attn.wq_b.weight" && x.Name != "layers.1.attn.wo_b.weight" {
			continue
		}
		v := make([]float32, x.Shape[0]*x.Shape[1])
		if err := weights.DecodeFloat32(v, x.Data, x.DType); err != nil {
			t.Fatal(err)
		}
		rows, cols := x.Shape[0], x.Shape[1]
		sr, sc := (rows+2)/3, (cols+2)/3
		scale := make([]float32, sr*sc)
		for r := range rows {
			for j := range cols {
				b := (r/3)*sc + j/3
				scale[b] = max(scale[b], float32(math.Abs(float64(v[r*cols+j])))/448)
			}
		}
		q := make([]byte, len(v))
		for r := range rows {
			for j := range cols {
				q[r*cols+j] = nearestE4M3(v[r*cols+j] / scale[(r/3)*sc+j/3])
			}
		}
		ts[i] = weights.Tensor{Name: x.Name, DType: weights.F8E4M3, Shape: x.Shape, Data: q}
		s, _ := weights.NewTensor(strings.TrimSuffix(x.Name, ".weight")+".scale", weights.F32, []int{sr, sc}, scale)
		ts = append(ts, s)
	}
	dir := t.TempDir()
	if err := weights.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
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
	whole, err := LoadWeights(c, ck)
	if err != nil {
		t.Fatal(err)
	}
	all := ck.BytesRead()
	ck.Close()
	l := Layout{TP: 2}
	for rank := range 2 {
		ck := open()
		got, err := LoadShard(c, ck, l, rank)
		read := ck.BytesRead()
		ck.Close()
		if err != nil {
			t.Fatal(err)
		}
		want, _ := ShardWeights(c, whole, l, rank)
		if !reflect.DeepEqual(got.Layers[1], want.Layers[1]) || read >= all {
			t.Fatalf("rank %d: layer 1 equal %v, %d of %d bytes read", rank, reflect.DeepEqual(got.Layers[1], want.Layers[1]), read, all)
		}
	}
}

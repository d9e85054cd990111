package deepseekv4flash

import (
	"os"
	"path/filepath"
	"reflect"
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

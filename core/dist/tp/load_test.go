package tp_test

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/tp"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/core/weights"
	"github.com/resin-llm/resin/models/llama"
)

// prefill runs a 13-token prompt's plan (every row's logits) through shards, one
// in-process rank each, and returns rank 0's logits.
func prefill(t *testing.T, c *llama.Config, shards []*tp.Shard) []float32 {
	t.Helper()
	pool, err := engine.NewHostPool(llama.CacheGroups(c, 4), 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	seq := runnertest.OpenSeq(t, pool, runnertest.Prompt(13, c.VocabSize, 5))
	plan := runnertest.Plan(t, pool, []*runnertest.Seq{seq}, []int{13}, true)
	comms, err := dist.NewInProcess(len(shards), dist.Options{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	logits := make([][]float32, len(shards))
	errs := make([]error, len(shards))
	var wg sync.WaitGroup
	for r, s := range shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			logits[r] = make([]float32, len(plan.LogitsIndices)*c.VocabSize)
			errs[r] = s.Forward(comms[r], plan, s.NewCache(16, 4), logits[r])
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return logits[0]
}

// TestLoadShardReadsItsSlices: over tp=2, each rank's LoadShard from a saved checkpoint
// reads only its slices (the two ranks together read the checkpoint once plus the
// replicated norms and o biases once more; each well under the whole), and the shards it
// builds give NewShard's logits bit for bit. Bad shapes and ranks are refused.
func TestLoadShardReadsItsSlices(t *testing.T) {
	m := tiny(t)
	c := m.Config
	rope, err := c.RopeTable(256)
	if err != nil {
		t.Fatal(err)
	}
	d, w := fromLlama(m, rope)
	dir := t.TempDir()
	if err := m.W.Save(c, dir, weights.F32); err != nil {
		t.Fatal(err)
	}
	const size = 2
	var total, replicated, sum int64
	loaded, cut := make([]*tp.Shard, size), make([]*tp.Shard, size)
	for r := range size {
		ck, err := weights.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		ck.SetProgress(nil)
		if r == 0 {
			for _, n := range ck.Names() {
				info, _ := ck.Info(n)
				total += info.Size
				if len(info.Shape) == 1 && !isBias(n, "q_proj", "k_proj", "v_proj") {
					replicated += info.Size
				}
			}
		}
		if loaded[r], err = tp.LoadShard(d, ck, r, size); err != nil {
			t.Fatal(err)
		}
		read := ck.BytesRead()
		ck.Close()
		if read > total/2+replicated {
			t.Fatalf("rank %d read %d bytes of a %d-byte checkpoint (%d replicated)", r, read, total, replicated)
		}
		sum += read
		if cut[r], err = tp.NewShard(d, w, r, size); err != nil {
			t.Fatal(err)
		}
	}
	if want := total + (size-1)*replicated; sum != want {
		t.Fatalf("the ranks read %d bytes together, want %d (the checkpoint's %d and the replicated %d once more)", sum, want, total, replicated)
	}
	got, want := prefill(t, c, loaded), prefill(t, c, cut)
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("logit %d: %g from the loaded shards, %g from the cut ones", i, got[i], want[i])
		}
	}
	ck, err := weights.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	ck.SetProgress(nil)
	bad := d
	bad.Hidden++
	if _, err := tp.LoadShard(bad, ck, 0, size); err == nil {
		t.Fatal("a hidden size the checkpoint does not have was accepted")
	}
	if _, err := tp.LoadShard(d, ck, 2, size); err == nil {
		t.Fatal("rank 2 of 2 was accepted")
	}
}

// isBias reports whether name is a bias of one of the column-parallel projections (cut,
// not replicated).
func isBias(name string, projs ...string) bool {
	for _, p := range projs {
		if len(name) > len(p)+5 && name[len(name)-len(p)-5:] == p+".bias" {
			return true
		}
	}
	return false
}

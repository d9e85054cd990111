package tp_test

import (
	"slices"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/dist/tp"
)

// TestStatsCountRankZerosCollectives: StartShardsTimed's group gives StartInProcess's
// logits bit for bit, and lockstep.Stats over it counts a prompt's step as prefill and
// each greedy step after it as decode, with rank 0's 2·layers+2 collectives per step
// (the embedding's all-reduce, two per layer, the head's all-gather) and their time
// inside the steps'.
func TestStatsCountRankZerosCollectives(t *testing.T) {
	m := tiny(t)
	rope, _ := m.Config.RopeTable(256)
	d, w := fromLlama(m, rope)
	pages, pt := 64, 4
	plain, err := tp.StartInProcess(d, w, 2, pages, pt, dist.Options{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	want, wantToks := run(t, plain.Forward, 5)

	shards := make([]*tp.Shard, 2)
	for r := range shards {
		if shards[r], err = tp.NewShard(d, w, r, 2); err != nil {
			t.Fatal(err)
		}
	}
	g, data, err := tp.StartShardsTimed(shards, pages, pt, dist.Options{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var st lockstep.Stats
	got, gotToks := run(t, st.Wrap(g.Forward, data), 5)
	if !slices.Equal(gotToks, wantToks) {
		t.Fatalf("timed group's tokens %v, untimed %v", gotToks, wantToks)
	}
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Fatalf("step %d: the timed group's logits differ from the untimed one's", i)
		}
	}
	perStep := int64(2*m.Config.NumHiddenLayers + 2)
	pre, dec := st.Phases()
	for _, c := range []struct {
		name          string
		p             lockstep.Phase
		steps, tokens int
	}{{"prefill", pre, 1, 10}, {"decode", dec, 5, 5}} {
		if c.p.Steps != c.steps || c.p.Tokens != c.tokens || c.p.Calls != int64(c.steps)*perStep {
			t.Errorf("%s: %d steps, %d tokens, %d collectives; want %d, %d, %d", c.name, c.p.Steps, c.p.Tokens, c.p.Calls, c.steps, c.tokens, int64(c.steps)*perStep)
		}
		if !(c.p.Comm > 0 && c.p.Comm <= c.p.Wall) {
			t.Errorf("%s: collectives %v of steps %v", c.name, c.p.Comm, c.p.Wall)
		}
	}
	if spent, calls := data.Spent(); calls != 6*perStep || spent != pre.Comm+dec.Comm {
		t.Errorf("rank 0's data communicator: %d calls in %v; the phases %d in %v", calls, spent, pre.Calls+dec.Calls, pre.Comm+dec.Comm)
	}
}

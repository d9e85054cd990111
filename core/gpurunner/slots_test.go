package gpurunner

import (
	"errors"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
)

// testSeq is a sequence's state in a fake runner: its slot and the tokens it holds.
type testSeq struct{ slot, n int }

// testSlots is a pool of n slots, recording which are taken.
func testSlots(n int) (*SeqSlots[*testSeq], []bool) {
	used := make([]bool, n)
	sl := &SeqSlots[*testSeq]{Name: "fake",
		New: func(*cudart.Ctx) (*testSeq, error) {
			for i, u := range used {
				if !u {
					used[i] = true
					return &testSeq{slot: i}, nil
				}
			}
			return nil, errFull
		},
		Free: func(s *testSeq) { used[s.slot] = false },
		Len:  func(s *testSeq) int { return s.n },
	}
	return sl, used
}

var errFull = errors.New("no free slot")

// plan builds a plan of the given requests, each at computed tokens with its tokens.
func plan(ids []uint64, computed []int32, toks [][]int32, released ...uint64) *engine.BatchPlan {
	p := &engine.BatchPlan{ReqIDs: ids, Computed: computed, QueryStart: []int32{0}}
	for _, t := range toks {
		p.Tokens = append(p.Tokens, t...)
		p.Positions = append(p.Positions, make([]int32, len(t))...)
		p.QueryStart = append(p.QueryStart, int32(len(p.Tokens)))
	}
	for _, id := range released {
		p.Released = append(p.Released, engine.Release{ReqID: id})
	}
	return p
}

func TestSeqSlotsBind(t *testing.T) {
	sl, used := testSlots(2)
	seqs, toks, err := sl.Bind(nil, plan([]uint64{7, 9}, []int32{0, 0}, [][]int32{{1, 2}, {3}}))
	if err != nil {
		t.Fatal(err)
	}
	if seqs[0].slot != 0 || seqs[1].slot != 1 || len(toks[0]) != 2 || toks[1][0] != 3 {
		t.Fatalf("new requests: slots %d %d, tokens %v", seqs[0].slot, seqs[1].slot, toks)
	}
	seqs[0].n, seqs[1].n = 2, 1
	// 7 continues, 9 is released and its slot goes to 11.
	seqs2, _, err := sl.Bind(nil, plan([]uint64{7, 11}, []int32{2, 0}, [][]int32{{4}, {5}}, 9))
	if err != nil {
		t.Fatal(err)
	}
	if seqs2[0] != seqs[0] || seqs2[1].slot != 1 || !used[0] || !used[1] {
		t.Fatalf("continued/released: %+v %+v, used %v", seqs2[0], seqs2[1], used)
	}
	seqs2[1].n = 1
	// 11 restarts from 0: it begins again in a fresh state.
	seqs3, _, err := sl.Bind(nil, plan([]uint64{11}, []int32{0}, [][]int32{{5}}))
	if err != nil {
		t.Fatal(err)
	}
	if seqs3[0] == seqs2[1] || seqs3[0].n != 0 {
		t.Fatalf("restart kept the old state %+v", seqs3[0])
	}
	for _, c := range []struct {
		name string
		p    *engine.BatchPlan
		want string
	}{
		{"prefix hit", plan([]uint64{12}, []int32{3}, [][]int32{{1}}), "request 12 resumes at 3 cached tokens"},
		{"mismatch", plan([]uint64{7}, []int32{5}, [][]int32{{1}}), "request 7 continues at 5 tokens, its device state holds 2"},
		{"drafts", func() *engine.BatchPlan {
			p := plan([]uint64{7}, []int32{2}, [][]int32{{1, 2}})
			p.NumDrafts = []int32{1}
			return p
		}(), "draft tokens"},
		{"full", plan([]uint64{20, 21}, []int32{0, 0}, [][]int32{{1}, {1}}), "no free slot"},
	} {
		_, _, err := sl.Bind(nil, c.p)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.name, err, c.want)
		}
	}
}

// TestSeqSlotsResume checks that a Resume hook serves a prefix hit (a slot filled at the
// cached length) and that Drafts lets draft tokens through.
func TestSeqSlotsResume(t *testing.T) {
	sl, used := testSlots(2)
	var resumed []int
	sl.Resume = func(c *cudart.Ctx, p *engine.BatchPlan, i int) (*testSeq, error) {
		s, err := sl.New(c)
		if err == nil {
			s.n = int(p.Computed[i])
			resumed = append(resumed, i)
		}
		return s, err
	}
	sl.Drafts = true
	p := plan([]uint64{3, 4}, []int32{0, 5}, [][]int32{{1}, {2, 3}})
	p.NumDrafts = []int32{0, 1}
	seqs, _, err := sl.Bind(nil, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(resumed) != 1 || resumed[0] != 1 || seqs[1].n != 5 || !used[0] || !used[1] {
		t.Fatalf("resumed %v, states %+v %+v, used %v", resumed, seqs[0], seqs[1], used)
	}
}

func TestSlotLimits(t *testing.T) {
	for _, c := range []struct{ in, want Limits }{
		{Limits{}, Limits{MaxTokens: 8192, MaxSeqs: 256, MaxRows: 256}},
		{Limits{MaxTokens: -1, MaxSeqs: -1, MaxRows: -1}, Limits{MaxTokens: 8192, MaxSeqs: 256, MaxRows: 256}},
		{Limits{MaxTokens: 100}, Limits{MaxTokens: 100, MaxSeqs: 100, MaxRows: 100}},
		{Limits{MaxTokens: 512, MaxSeqs: 8, MaxRows: 3}, Limits{MaxTokens: 512, MaxSeqs: 8, MaxRows: 3}},
	} {
		if got := slotLimits(c.in); got != c.want {
			t.Errorf("slotLimits(%+v) = %+v, want %+v", c.in, got, c.want)
		}
	}
}

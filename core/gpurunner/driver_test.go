package gpurunner

import (
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// driver builds the plans of a few sequences step by step, as the scheduler would: each
// sequence's pages are handed out from a counter, numbered as kvslab numbers them in a
// pool whose slabs hold slots pages each.
type driver struct {
	pageTokens, slots int
	next              int
	seqs              []*driverSeq
}

type driverSeq struct {
	prompt   int // prompt length
	computed int
	pages    []kvslab.PageID
}

func (d *driver) add(promptLen int) int {
	d.seqs = append(d.seqs, &driverSeq{prompt: promptLen})
	return len(d.seqs) - 1
}

// pageID is the id of the n-th page handed out.
func (d *driver) pageID(n int) kvslab.PageID {
	return kvslab.PageID(n/d.slots)<<kvslab.SlotBits | kvslab.PageID(n%d.slots)
}

// pageIndex inverts pageID: where a page sits in a cache packed back to back.
func (d *driver) pageIndex(id uint32) int {
	return int(id>>kvslab.SlotBits)*d.slots + int(id&kvslab.SlotMask)
}

// plan is the step feeding feeds[i] to sequence seqs[i]; a sequence has a logits row
// when the step reaches the end of its prompt or decodes. graph is the GraphBatch.
func (d *driver) plan(seqs []int, feeds [][]int32, graph int) *engine.BatchPlan {
	specs := make([]seqSpec, len(seqs))
	for j, i := range seqs {
		s := d.seqs[i]
		end := s.computed + len(feeds[j])
		for len(s.pages)*d.pageTokens < end {
			d.next++
			s.pages = append(s.pages, d.pageID(d.next))
		}
		rows := 0
		if end >= s.prompt {
			rows = 1
		}
		specs[j] = seqSpec{computed: int32(s.computed), promptLen: int32(s.prompt), tokens: feeds[j],
			pages: append([]kvslab.PageID(nil), s.pages[:(end+d.pageTokens-1)/d.pageTokens]...), rows: rows}
		s.computed = end
	}
	p := buildPlan(d.pageTokens, specs...)
	p.GraphBatch = int32(graph)
	return p
}

package deepseekv4flash

import (
	"fmt"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// timedComm counts the time a rank spends inside the collectives of a forward.
type timedComm struct {
	dist.Communicator
	spent time.Duration
}

func (c *timedComm) AllReduce(buf []byte, t dist.DType) error {
	s := time.Now()
	defer func() { c.spent += time.Since(s) }()
	return c.Communicator.AllReduce(buf, t)
}

func (c *timedComm) AllGatherV(send []byte) ([][]byte, error) {
	s := time.Now()
	defer func() { c.spent += time.Since(s) }()
	return c.Communicator.AllGatherV(send)
}

func (c *timedComm) ReduceScatterV(send []byte, counts []int, t dist.DType) ([]byte, error) {
	s := time.Now()
	defer func() { c.spent += time.Since(s) }()
	return c.Communicator.ReduceScatterV(send, counts, t)
}

func (c *timedComm) AllToAllV(send [][]byte) ([][]byte, error) {
	s := time.Now()
	defer func() { c.spent += time.Since(s) }()
	return c.Communicator.AllToAllV(send)
}

// BenchmarkParallel times a 64-token prefill and a decode step of 8 sequences (the same
// plan replayed) of the in-tree config (config.json: hidden 128, 8 experts, 4 layers) on
// one rank, TP=2, EP=2 and TP=2×EP=2 over in-process ranks, and reports tokens/s and the
// share of rank 0's step spent in collectives (comm-share). On a 2-core machine two ranks
// cannot be faster than one: the figure to read is the communication share.
func BenchmarkParallel(b *testing.B) {
	for _, phase := range []struct {
		name        string
		seqs, feeds int
	}{{"prefill", 1, 64}, {"decode", 8, 1}} {
		for _, l := range []Layout{{}, {TP: 2}, {EP: 2}, {TP: 2, EP: 2}} {
			b.Run(fmt.Sprintf("%s/tp=%d,ep=%d", phase.name, max(l.TP, 1), max(l.EP, 1)), func(b *testing.B) {
				var timed *timedComm
				var pool0 *kvslab.Pool
				var vocab int
				g, err := lockstep.StartInProcess(l.Size(), dist.Options{Timeout: time.Minute}, func(rank int, data dist.Communicator) (lockstep.Rank, error) {
					if rank == 0 {
						timed = &timedComm{Communicator: data}
						data = timed
					}
					r, pool, err := OpenRank(".", Options{}, l, data, 64<<20)
					if err != nil {
						return lockstep.Rank{}, err
					}
					if rank == 0 {
						pool0, vocab = pool, r.Model.Config.VocabSize
					}
					return r.LockstepRank(rank, pool), nil
				})
				if err != nil {
					b.Fatal(err)
				}
				defer g.Close()
				var seqs []*runnertest.Seq
				pre, feed := make([]int, phase.seqs), make([]int, phase.seqs)
				for j := range phase.seqs {
					seqs = append(seqs, runnertest.OpenSeq(b, pool0, runnertest.Prompt(65, vocab, j)))
					pre[j], feed[j] = 64, phase.feeds
				}
				if phase.feeds == 1 { // the decode step follows a 64-token prompt
					if err := g.Forward(runnertest.Plan(b, pool0, seqs, pre, false), make([]float32, phase.seqs*vocab)); err != nil {
						b.Fatal(err)
					}
				}
				plan := runnertest.Plan(b, pool0, seqs, feed, false)
				logits := make([]float32, phase.seqs*vocab)
				if err := g.Forward(plan, logits); err != nil {
					b.Fatal(err)
				}
				timed.spent = 0
				b.ResetTimer()
				start := time.Now()
				for range b.N {
					if err := g.Forward(plan, logits); err != nil {
						b.Fatal(err)
					}
				}
				el := time.Since(start)
				b.ReportMetric(float64(phase.seqs*phase.feeds*b.N)/el.Seconds(), "tok/s")
				b.ReportMetric(timed.spent.Seconds()/el.Seconds(), "comm-share")
			})
		}
	}
}

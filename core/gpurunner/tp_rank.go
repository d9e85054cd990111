package gpurunner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/tp"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// TPRank is one rank of a dense model's GPU tensor parallelism (TP describes the layout):
// its runner on its GPU, joined to the group's NCCL communicator, and the group's control
// communicator, on which rank 0 broadcasts each plan and the others follow. Rank 0 is the
// engine's runner; the others call Follow. The ranks may be goroutines of one process
// (NewDenseTPShards) or processes of their own, a worker per rank (JoinDenseTP over a
// control communicator across processes: dist.JoinShm or dist.JoinTCP); the step is the
// same Runner.Execute either way.
type TPRank struct {
	r       *Runner
	ctl     dist.Communicator
	rank    int
	size    int
	comm    *cudart.Comm
	dog     *Watchdog     // bounds each step once comm is joined (nil before, and for a group of one)
	timeout time.Duration // Options.Watchdog
	cp      bool          // a rank of context parallelism (cp.go), not of tensor parallelism alone
	// cpSize is the cp group's size: the world's under CP alone (comm is the cp group's),
	// or under CP × TP (NewDenseCPTP) size/cpSize TP groups, comm the rank's TP group's
	// and cpComm its cp group's (0 and nil otherwise).
	cpSize   int
	cpComm   *cudart.Comm
	partial  cudart.Buffer // the float32 partial o and down products, summed in place
	gathered cudart.Buffer // the group's head outputs (tpRank)
	msg      []byte
	stopped  bool
	closed   StepStats // the runner's Stats when Close freed it
	info     engine.RunnerInfo
	// capture is whether rank 0 brings every step's logits back (CaptureLogits), and
	// told whether the followers were last told so (msgCapture).
	capture, told bool
}

// msgCapture is rank 0's control message that sets the followers' logits capture to
// match its own, [msgCapture, 0|1], sent before the next plan when rank 0's changed. A
// rank that captures brings every token row's logits through the head's all-gather, one
// that samples on the device only the plan's logits rows: the ranks must agree, or rank 0
// gathers the others' rows of another step shape. lockstep's messages start with 0, 1 or
// 2, so this one cannot be taken for one of them.
const msgCapture byte = 0xfe

// followCtl is a follower's control communicator: it takes rank 0's msgCapture messages
// off the stream lockstep reads, setting the rank's capture, and passes the rest on.
type followCtl struct {
	dist.Communicator
	g *TPRank
}

func (c followCtl) Broadcast(buf []byte, root int) ([]byte, error) {
	for {
		b, err := c.Communicator.Broadcast(buf, root)
		if err != nil || len(b) != 2 || b[0] != msgCapture {
			return b, err
		}
		if b[1] == 1 {
			c.g.r.CaptureLogits(func(cpurunner.LogitsRow) {}) // the logits are rank 0's to use
		} else {
			c.g.r.CaptureLogits(nil)
		}
	}
}

var (
	_ engine.Runner            = (*TPRank)(nil)
	_ cpurunner.LogitsCapturer = (*TPRank)(nil)
)

// tpHello is rank 0's first control message: the NCCL id and its cache's geometry, which
// every rank's pool takes (so rank 0's page ids address their caches alike), or why rank
// 0 failed (the others then return at once rather than wait for it).
type tpHello struct {
	ID []byte `json:",omitempty"`
	// IDs are CP × TP's: the TP groups' (one per cp rank), then the cp groups' (one per
	// tp rank).
	IDs        [][]byte `json:",omitempty"`
	CacheBytes int64
	Slabs      int
	SlabBytes  int64
	Err        string `json:",omitempty"`
}

// JoinDenseTP opens rank ctl.Rank() of a dense model split over ctl.Size() ranks, one a
// process (or goroutine) each: its part of the model from shard (CutDense, or ReadDense
// for a checkpoint's slices) on GPU opts.Ordinal. Rank 0 opens its runner first, creates
// the NCCL id and broadcasts it on ctl with its cache's bytes (the others' opts.CacheBytes
// are replaced by them); every rank then reports on ctl whether it opened, so a failure
// anywhere fails every rank with the failed rank's error, and the ranks join the NCCL
// communicator. The pool is for engine.Config.Pool on rank 0.
func JoinDenseTP(shard DenseShard, ctl dist.Communicator, opts Options) (*TPRank, *kvslab.Pool, error) {
	return joinDenseTP(shard, ctl, opts, func(fn func() error) error { return fn() })
}

// joinDenseTP is JoinDenseTP with the shard's reading and upload run through serial (an
// in-process group runs them one rank at a time).
func joinDenseTP(shard DenseShard, ctl dist.Communicator, opts Options, serial func(func() error) error) (*TPRank, *kvslab.Pool, error) {
	return joinDense(shard, ctl, opts, serial, 1)
}

// joinDense is joinDenseTP, or with cp above 1 the same rank of a context-parallel group:
// NewDenseCP's when cp is ctl's size (shard gives every rank the whole model), else
// NewDenseCPTP's, whose ctl.Size()/cp TP groups each take shard's parts.
func joinDense(shard DenseShard, ctl dist.Communicator, opts Options, serial func(func() error) error, cp int) (*TPRank, *kvslab.Pool, error) {
	rank, size := ctl.Rank(), ctl.Size()
	if cp < 1 || size%cp != 0 {
		return nil, nil, fmt.Errorf("gpurunner: cp=%d over %d ranks", cp, size)
	}
	g := &TPRank{ctl: ctl, rank: rank, size: size, cp: cp > 1, timeout: opts.Watchdog}
	tpSize := size / cp
	if cp > 1 {
		g.cpSize = cp
	}
	var pool *kvslab.Pool
	open := func() error {
		sc, sw, err := shard(rank%tpSize, tpSize)
		if err != nil {
			return err
		}
		if g.r, pool, err = NewDense(sc, sw, opts); err == nil {
			g.info = g.r.Info()
		}
		return err
	}
	fail := func(err error) (*TPRank, *kvslab.Pool, error) {
		if g.r != nil {
			g.r.Close()
		}
		return nil, nil, fmt.Errorf("gpurunner: %s rank %d of %d: %w", g.kind(), rank, size, err)
	}
	var hello tpHello
	var id cudart.NCCLUniqueID
	var ids [][]byte // CP × TP's
	if rank == 0 {
		err := serial(open)
		if err == nil && size > 1 {
			id, err = cudart.NewNCCLUniqueID()
		}
		if g.cpComms() {
			for range cp + tpSize {
				if err != nil {
					break
				}
				var more cudart.NCCLUniqueID
				more, err = cudart.NewNCCLUniqueID()
				ids = append(ids, more.Internal[:])
			}
		}
		if err != nil {
			hello.Err = err.Error()
		} else {
			// The others' caches take rank 0's bytes, not what their GPU has left (two
			// ranks on one GPU see different free memory).
			hello = tpHello{ID: id.Internal[:], IDs: ids, CacheBytes: int64(pool.Slabs()) * pool.SlabBytes(), Slabs: pool.Slabs(), SlabBytes: pool.SlabBytes()}
		}
		if size > 1 {
			b, _ := json.Marshal(hello)
			if _, berr := ctl.Broadcast(b, 0); berr != nil && err == nil {
				err = fmt.Errorf("hand the NCCL id to the other ranks: %w", berr)
			}
		}
		if err != nil {
			return fail(err)
		}
	} else {
		b, err := ctl.Broadcast(nil, 0)
		if err != nil {
			return fail(fmt.Errorf("wait for rank 0's NCCL id: %w", err))
		}
		if err := json.Unmarshal(b, &hello); err != nil {
			return fail(fmt.Errorf("rank 0's first message: %w", err))
		}
		if hello.Err != "" {
			return fail(fmt.Errorf("rank 0 failed: %s", hello.Err))
		}
		if len(hello.ID) != len(id.Internal) {
			return fail(fmt.Errorf("rank 0 sent a %d-byte NCCL id", len(hello.ID)))
		}
		copy(id.Internal[:], hello.ID)
		if g.cpComms() {
			if len(hello.IDs) != cp+tpSize {
				return fail(fmt.Errorf("rank 0 sent %d NCCL ids for cp=%d tp=%d", len(hello.IDs), cp, tpSize))
			}
			for _, b := range hello.IDs {
				if len(b) != len(id.Internal) {
					return fail(fmt.Errorf("rank 0 sent a %d-byte NCCL id", len(b)))
				}
			}
			ids = hello.IDs
		}
		opts.CacheBytes = hello.CacheBytes
		err = serial(open)
		if err == nil && (pool.Slabs() != hello.Slabs || pool.SlabBytes() != hello.SlabBytes) {
			err = fmt.Errorf("its cache (%d slabs of %d bytes) is not rank 0's (%d of %d)", pool.Slabs(), pool.SlabBytes(), hello.Slabs, hello.SlabBytes)
		}
		// Rank 0 learns of it in the report below.
		if err != nil {
			g.report(err)
			return fail(err)
		}
	}
	if size == 1 {
		return g, pool, nil
	}
	if err := g.report(nil); err != nil {
		return fail(err)
	}
	if err := g.join(id, ids); err != nil {
		g.Close()
		return nil, nil, fmt.Errorf("gpurunner: %s rank %d of %d: %w", g.kind(), rank, size, err)
	}
	// Each rank's place, as vLLM logs it ("rank 1 in world size 4 is assigned as ...").
	place := ""
	if g.cpComms() {
		place = fmt.Sprintf(": tp rank %d of %d, cp rank %d of %d", rank%tpSize, tpSize, rank/tpSize, cp)
	}
	fmt.Fprintf(g.r.log, "gpu: %s rank %d of %d%s, on GPU %d\n", g.kind(), rank, size, place, opts.Ordinal)
	return g, pool, nil
}

// kind names the rank's group in messages: "tp", "cp" for context parallelism, or
// "cp×tp" for both.
func (g *TPRank) kind() string {
	switch {
	case g.cpComms():
		return "cp×tp"
	case g.cp:
		return "cp"
	}
	return "tp"
}

// cpComms reports whether the rank is one of CP × TP, with a TP and a cp communicator.
func (g *TPRank) cpComms() bool { return g.cp && g.cpSize < g.size }

// report is reportOpened on the rank's control communicator.
func (g *TPRank) report(mine error) error { return reportOpened(g.ctl, mine) }

// join joins the NCCL communicator of id from the rank's device thread (blocking until
// every rank has) and gives its model the all-reduce and all-gather buffers. A CP × TP
// rank joins two instead, of ids (tpHello.IDs): its TP group's, then its cp group's
// (every rank joins its TP group first, so no join waits on a rank in another).
func (g *TPRank) join(id cudart.NCCLUniqueID, ids [][]byte) error {
	rr := g.r
	cfg := rr.model.Config
	return rr.dev.Do(func(c *cudart.Ctx) error {
		var err error
		name := fmt.Sprintf("gpurunner: %s rank %d of %d", g.kind(), g.rank, g.size)
		tpSize := g.size
		if g.cpComms() {
			tpSize = g.size / g.cpSize
			var tpID, cpID cudart.NCCLUniqueID
			copy(tpID.Internal[:], ids[g.rank/tpSize])
			copy(cpID.Internal[:], ids[g.cpSize+g.rank%tpSize])
			if g.comm, err = cudart.InitComm(c, tpID, tpSize, g.rank%tpSize); err != nil {
				return fmt.Errorf("join the TP group's NCCL communicator: %w", err)
			}
			if g.cpComm, err = cudart.InitComm(c, cpID, g.cpSize, g.rank/tpSize); err != nil {
				return fmt.Errorf("join the cp group's NCCL communicator: %w", err)
			}
			g.dog = NewWatchdog(g.comm, g.timeout, name)
			g.dog.Also(g.cpComm)
		} else {
			if g.comm, err = cudart.InitComm(c, id, g.size, g.rank); err != nil {
				return fmt.Errorf("join the NCCL communicator: %w", err)
			}
			g.dog = NewWatchdog(g.comm, g.timeout, name)
			if g.cp {
				return g.joinCP(c, g.comm, g.rank, g.size)
			}
		}
		if g.partial, err = c.Alloc(int64(rr.limits.MaxTokens) * int64(cfg.Hidden) * 4); err != nil {
			return fmt.Errorf("the partial products' buffer: %w", err)
		}
		if g.gathered, err = c.Alloc(int64(tpSize) * int64(rr.limits.MaxRows) * int64(cfg.VocabRows()) * 4); err != nil {
			return fmt.Errorf("the gathered logits' buffer: %w", err)
		}
		rr.model.tp = &tpRank{comm: g.comm, partial: g.partial.Ptr, gathered: g.gathered.Ptr}
		if g.cpComms() {
			return g.joinCP(c, g.cpComm, g.rank/tpSize, g.cpSize)
		}
		return nil
	})
}

// Rank is the rank's place in the group; 0 runs the engine.
func (g *TPRank) Rank() int { return g.rank }

// Info describes the runner to the engine: the rank's (every rank's is the same).
func (g *TPRank) Info() engine.RunnerInfo { return g.info }

// Stats are the rank's Runner.Stats (final after Close).
func (g *TPRank) Stats() StepStats {
	if g.r == nil {
		return g.closed
	}
	return g.r.Stats
}

// Execute is rank 0's step: it broadcasts plan to the other ranks and runs it with them.
func (g *TPRank) Execute(ctx context.Context, plan *engine.BatchPlan) (engine.StepResult, error) {
	if g.rank != 0 {
		return engine.StepResult{}, fmt.Errorf("gpurunner: %s rank %d follows rank 0's plans; only rank 0 executes the engine's", g.kind(), g.rank)
	}
	if err := ctx.Err(); err != nil {
		return engine.StepResult{}, err
	}
	if g.size > 1 {
		// Refused here, before the others see it: a rank that fails a step leaves the
		// group (the others would wait in its collectives).
		if err := g.r.checkDims(plan); err != nil {
			return engine.StepResult{}, err
		}
		if g.capture != g.told {
			flag := byte(0)
			if g.capture {
				flag = 1
			}
			if _, err := g.ctl.Broadcast([]byte{msgCapture, flag}, 0); err != nil {
				return engine.StepResult{}, err
			}
			g.told = g.capture
		}
		if err := tp.BroadcastPlan(g.ctl, plan, &g.msg); err != nil {
			return engine.StepResult{}, err
		}
	}
	return g.step(ctx, plan)
}

// step runs plan on the rank's runner under its watchdog.
func (g *TPRank) step(ctx context.Context, plan *engine.BatchPlan) (res engine.StepResult, err error) {
	err = g.dog.Step(func() error {
		res, err = g.r.Execute(ctx, plan)
		return err
	})
	return res, err
}

// Abort aborts the rank's NCCL communicator now (Watchdog.Abort): the step in flight, if
// any, and every later one fail with why. Rank 0 calls it when a worker process exits
// (launch.Workers), so that its step does not wait in a collective for the dead rank.
func (g *TPRank) Abort(why error) { g.dog.Abort(why) }

// Follow runs a rank other than 0: each plan rank 0 broadcasts, until its Stop (then nil)
// or an error (rank 0 or a peer gone, a failed step).
func (g *TPRank) Follow() error {
	if g.rank == 0 {
		return errors.New("gpurunner: tp rank 0 leads; it does not follow")
	}
	err := tp.FollowPlans(followCtl{g.ctl, g}, func(p *engine.BatchPlan) error {
		_, err := g.step(context.Background(), p)
		return err
	})
	if err != nil {
		return fmt.Errorf("gpurunner: %s rank %d: %w", g.kind(), g.rank, err)
	}
	return nil
}

// CaptureLogits implements cpurunner.LogitsCapturer on rank 0's runner; the followers
// capture and drop theirs from the next step on (msgCapture), so that every rank takes
// the same path through each step (host sampling for all). After Close it does nothing
// (generate's capture ends after the engine stopped the ranks).
func (g *TPRank) CaptureLogits(fn func(cpurunner.LogitsRow)) {
	if g.r != nil {
		g.r.CaptureLogits(fn)
		g.capture = fn != nil
	}
}

// Stop tells the followers to return from Follow (rank 0; once, and a no-op elsewhere).
func (g *TPRank) Stop() error {
	if g.rank != 0 || g.size == 1 || g.stopped {
		return nil
	}
	g.stopped = true
	return tp.Stop(g.ctl)
}

// Close frees the rank's communicator, its buffers and its runner (not ctl, its
// caller's). Rank 0 should Stop the others first.
func (g *TPRank) Close() error {
	if g.r == nil {
		return nil
	}
	var errs []error
	if g.comm != nil || g.partial.Size > 0 {
		errs = append(errs, g.r.dev.Do(func(c *cudart.Ctx) error {
			if cs := g.r.model.cp; cs != nil {
				cs.free(c)
				g.r.model.cp = nil
			}
			if g.partial.Size > 0 {
				c.Free(g.partial)
			}
			if g.gathered.Size > 0 {
				c.Free(g.gathered)
			}
			var errs []error
			for _, comm := range []*cudart.Comm{g.cpComm, g.comm} {
				if comm != nil {
					errs = append(errs, comm.Destroy())
				}
			}
			return errors.Join(errs...)
		}))
	}
	errs = append(errs, g.r.Close())
	g.closed, g.r = g.r.Stats, nil
	return errors.Join(errs...)
}

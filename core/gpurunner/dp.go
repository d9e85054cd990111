package gpurunner

import (
	"errors"
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// DPRows checks plan p of a DP-attention rank (core/dist/dp's step: p.DP set) for dp rank
// rank of size whose steps hold up to maxTokens rows, and returns the rows every rank's
// MoE exchanges this step: the most any rank has, or DP.Pad (a graph bucket) when larger.
// Its checks of the counts every rank has alike refuse on every rank; those of this
// rank's own plan (its count, its padding, an idle plan asking for logits) on this rank
// alone, so a rank hands its refusal to AgreeDP before any collective. name prefixes the
// errors.
func DPRows(name string, p *engine.BatchPlan, logits []float32, rank, size, maxTokens int) (int, error) {
	most := int(p.DP.Pad)
	for _, t := range p.DP.Tokens {
		most = max(most, int(t))
	}
	switch {
	case len(p.DP.Tokens) != size || int(p.DP.Rank) != rank:
		return 0, fmt.Errorf("%s on the GPU: a plan of dp rank %d of %d on dp rank %d of %d", name, p.DP.Rank, len(p.DP.Tokens), rank, size)
	case int(p.DP.Tokens[rank]) != p.NumTokens():
		return 0, fmt.Errorf("%s on the GPU: dp rank %d's plan has %d tokens, its step says %d", name, rank, p.NumTokens(), p.DP.Tokens[rank])
	case p.DP.Pad < 0 || p.DP.Pad > 0 && int(p.DP.Pad) < p.NumTokens():
		return 0, fmt.Errorf("%s on the GPU: dp rank %d pads %d tokens to %d rows", name, rank, p.NumTokens(), p.DP.Pad)
	case most < 1 || most > maxTokens:
		return 0, fmt.Errorf("%s on the GPU: a dp step of %d rows a rank, for steps of 1 to %d", name, most, maxTokens)
	case p.NumTokens() == 0 && (len(p.LogitsIndices) > 0 || len(logits) > 0):
		return 0, fmt.Errorf("%s on the GPU: an idle plan asks for %d logits rows", name, len(p.LogitsIndices))
	}
	return most, nil
}

// DPRanks are the ranks of a model's DP-attention on GPUs of this process (OpenDPRanks):
// one runner and device pool each, on its own device, and the NCCL communicator their
// layers exchange rows on.
type DPRanks[R interface{ Close() error }] struct {
	Runners []R
	Pools   []*kvslab.Pool
	devs    []*cudart.Device
	comms   []*cudart.Comm
}

// CheckDPGroup refuses a dp group of fewer than 2 ranks, or whose communicators are not
// rank r of len(data) in turn.
func CheckDPGroup(data []dist.Communicator) error {
	if len(data) < 2 {
		return fmt.Errorf("DP-attention over %d ranks: want 2 or more", len(data))
	}
	for r, comm := range data {
		if comm.Rank() != r || comm.Size() != len(data) {
			return fmt.Errorf("dp rank %d has a communicator of rank %d of %d", r, comm.Rank(), comm.Size())
		}
	}
	return nil
}

// OpenDPRanks opens size dp ranks of model name with open: rank r on GPU
// opts.Ordinal+r where the driver sees that many, else every rank on opts.Ordinal
// (OpenRankDevices), each opened with the device, the kernel cache and the limits; then
// joins their NCCL communicator and hands each runner its end through setComm. On an
// error every rank opened is closed, and the devices.
func OpenDPRanks[R interface{ Close() error }](name string, opts Options, size int,
	open func(rank int, dev *cudart.Device, cache *cudart.KernelCache, lim Limits) (R, *kvslab.Pool, error), setComm func(R, *cudart.Comm)) (*DPRanks[R], error) {
	lim, cache, devs, err := OpenRankDevices(opts, name, size)
	if err != nil {
		return nil, err
	}
	g := &DPRanks[R]{devs: devs}
	ok := false
	defer func() {
		if !ok {
			g.Close()
		}
	}()
	for r := range size {
		run, pool, err := open(r, devs[r], cache, lim)
		if err != nil {
			return nil, fmt.Errorf("rank %d: %w", r, err)
		}
		g.Runners, g.Pools = append(g.Runners, run), append(g.Pools, pool)
	}
	if g.comms, err = JoinComms(name, devs); err != nil {
		return nil, err
	}
	for r, run := range g.Runners {
		setComm(run, g.comms[r])
	}
	ok = true
	return g, nil
}

// Close frees the communicator, closes every rank's runner, then the devices.
func (g *DPRanks[R]) Close() error {
	errs := []error{DestroyComms(g.devs, g.comms)}
	for _, run := range g.Runners {
		errs = append(errs, run.Close())
	}
	CloseDevices(g.devs)
	g.comms, g.Runners, g.devs = nil, nil, nil
	return errors.Join(errs...)
}

// AgreeDP has the dp ranks agree, over the group's host communicator c, that every one of
// them runs this step: mine is this rank's refusal of its plan (nil: it runs), checked
// before any collective of the step. It returns mine, or an error naming a rank that
// refused, so that a step one rank refuses is refused by all of them and none waits in a
// collective the refusing one never calls (NCCL's wait has no deadline).
func AgreeDP(c dist.Communicator, mine error) error {
	ok := []byte{1}
	if mine != nil {
		ok[0] = 0
	}
	all, err := c.AllGatherV(ok)
	if err != nil {
		return errors.Join(mine, fmt.Errorf("dp rank %d: agree on the step: %w", c.Rank(), err))
	}
	if mine != nil {
		return mine
	}
	for q, m := range all {
		if len(m) != 1 || m[0] != 1 {
			return fmt.Errorf("dp rank %d refused the step, so every rank does", q)
		}
	}
	return nil
}

// DPRank is what a model's GPU runner gives DPStep: its place in the dp group, its
// steps' rows at most, and its host communicator.
type DPRank struct {
	Name             string
	Rank, Size, Rows int
	Host             dist.Communicator
}

// DPStep is a dp rank's forward of plan p under core/dist/dp's Group (a model's
// GPURunner.DPForward): the step's rows (DPRows) and, for a plan with tokens, check's
// refusal of it (what the forward would refuse) agreed on with every rank (AgreeDP);
// then setRows with the rows every rank exchanges, and forward for a plan with tokens or
// idle for an idle one.
func DPStep(d DPRank, p *engine.BatchPlan, logits []float32, check func() error, setRows func(int), forward, idle func() error) error {
	rows, mine := DPRows(d.Name, p, logits, d.Rank, d.Size, d.Rows)
	if mine == nil && p.NumTokens() > 0 {
		mine = check()
	}
	if err := AgreeDP(d.Host, mine); err != nil {
		return err
	}
	setRows(rows)
	if p.NumTokens() > 0 {
		return forward()
	}
	return idle()
}

// JoinDPRank opens one DP-attention rank of a model's GPU runner as a process of its own
// (a model's JoinGPUDPRank) on GPU opts.Ordinal: its device and kernel cache, then open
// (its runner over the device, with a pool of the bytes given, rank 0's to the others)
// inside JoinPeerRank's rendezvous on hello (rank 0's NCCL id and pool geometry, every
// rank's outcome, the NCCL join), setComm handing the runner its NCCL end. owns makes
// the runner close the device with itself; the device is closed here where open failed.
// Close the ProcRank to free the communicator, the runner and the device.
func JoinDPRank[R interface{ Close() error }](name string, opts Options, hello dist.Communicator, cacheBytes int64,
	open func(dev *cudart.Device, cache *cudart.KernelCache, lim Limits, cacheBytes int64) (R, *kvslab.Pool, error),
	owns func(R), setComm func(R, *cudart.Comm)) (R, *kvslab.Pool, *ProcRank, error) {
	var run R
	var pool *kvslab.Pool
	if err := Available(opts.Ordinal); err != nil {
		return run, nil, nil, err
	}
	lim, cache, dev, err := OpenSlotDevice(opts, name)
	if err != nil {
		return run, nil, nil, err
	}
	opened := false
	proc, err := JoinPeerRank(name, hello, cacheBytes, func(bytes int64) (GroupRank, error) {
		var err error
		if run, pool, err = open(dev, cache, lim, bytes); err != nil {
			return GroupRank{}, err
		}
		opened = true
		owns(run) // closed with the runner from here on
		return GroupRank{Device: dev, Pool: pool, Close: run.Close, SetComm: func(c *cudart.Comm) { setComm(run, c) }, Watchdog: opts.Watchdog}, nil
	})
	if err != nil {
		if !opened {
			dev.Close()
		}
		var zero R
		return zero, nil, nil, err
	}
	return run, pool, proc, nil
}

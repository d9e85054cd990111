package gpurunner

import (
	"errors"
	"fmt"
	"slices"

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

// DPStepsWord says how dp ranks run their steps, with decode graphs or without, for the
// models' logs.
func DPStepsWord(graphs bool) string {
	if graphs {
		return "decode graphs"
	}
	return "eager steps"
}

// DPRanks are the ranks of a model's DP-attention on GPUs of this process (OpenDPRanks):
// one runner and device pool each, on its own device, and the NCCL communicator their
// layers exchange rows on.
type DPRanks[R interface{ Close() error }] struct {
	Runners []R
	Pools   []*kvslab.Pool
	devs    []*cudart.Device
	comms   []*cudart.Comm
	dogs    []*Watchdog // each rank's (Options.Watchdog), once comms is joined
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
// joins their NCCL communicator and hands each runner its end through setComm; each
// rank's steps run under a watchdog of opts.Watchdog (Step). On an error every rank opened
// is closed, and the devices.
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
		g.dogs = append(g.dogs, NewWatchdog(g.comms[r], opts.Watchdog, fmt.Sprintf("dp rank %d of %d", r, size)))
	}
	ok = true
	return g, nil
}

// Step runs fn, a step of dp rank rank, under the rank's watchdog: past Options.Watchdog
// the rank's NCCL communicator is aborted and the step fails with an *AbortError (NCCL's
// waits have no deadline: a rank hung in a collective would hold the others in it for
// good), as every later step of the rank does.
func (g *DPRanks[R]) Step(rank int, fn func() error) error {
	if rank < 0 || rank >= len(g.dogs) {
		return fmt.Errorf("dp rank %d of %d", rank, len(g.dogs))
	}
	return g.dogs[rank].Step(fn)
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
	_, err := AgreeDPStep(c, mine, false, false)
	return err
}

// DPGraph is how every dp rank runs a step (AgreeDPStep): eagerly, or as the CUDA graph
// of its rows, replaying the graph each rank holds or capturing it anew on every rank.
type DPGraph int

const (
	DPEager   DPGraph = iota
	DPReplay          // every rank replays its graph of the step's bucket
	DPCapture         // every rank drops any graph of the bucket, runs the step eagerly and captures it
)

// AgreeDPStep is AgreeDP that also agrees on whether the step runs as CUDA graphs: can
// says this rank can run it as the graph of the step's rows, held that it holds that
// graph already. NCCL requires whether a launch is graph-captured to be uniform over the
// ranks, and a graph's replay to be collective for the ranks that captured it together:
// so the step runs as graphs only when every rank can, replayed only when every rank
// holds its graph, and otherwise captured anew on every rank at this step (a rank whose
// graph was dropped, or never captured, does not replay against the others' captures).
func AgreeDPStep(c dist.Communicator, mine error, can, held bool) (DPGraph, error) {
	v := byte(1)
	switch {
	case mine != nil:
		v = 0
	case can && held:
		v = 3
	case can:
		v = 2
	}
	all, err := c.AllGatherV([]byte{v})
	if err != nil {
		return DPEager, errors.Join(mine, fmt.Errorf("dp rank %d: agree on the step: %w", c.Rank(), err))
	}
	if mine != nil {
		return DPEager, mine
	}
	least := byte(3)
	for q, m := range all {
		if len(m) != 1 || m[0] == 0 || m[0] > 3 {
			return DPEager, fmt.Errorf("dp rank %d refused the step, so every rank does", q)
		}
		least = min(least, m[0])
	}
	switch least {
	case 3:
		return DPReplay, nil
	case 2:
		return DPCapture, nil
	}
	return DPEager, nil
}

// DPRank is what a model's GPU runner gives DPStep: its place in the dp group, its
// steps' rows at most, and its host communicator.
type DPRank struct {
	Name             string
	Rank, Size, Rows int
	Host             dist.Communicator
	// Graph reports whether the rank can run the step (an idle one too) as the CUDA
	// graph of rows rows a rank, and whether it holds that graph already (nil: it never
	// can).
	Graph func(rows int) (can, held bool)
	// MoE is the rank's MoE exchange (nil: none), whose MaskReal DPStep sets for the step:
	// a graph step's padding rows masked on the device.
	MoE *DPMoE
}

// DPStep is a dp rank's forward of plan p under core/dist/dp's Group (a model's
// GPURunner.DPForward): the step's rows (DPRows) and, for a plan with tokens, check's
// refusal of it (what the forward would refuse) agreed on with every rank, and whether
// every rank runs it as the CUDA graph of those rows (AgreeDPStep, each rank's
// DPRank.Graph); then set with the rows every rank exchanges and that outcome, and
// forward for a plan with tokens or idle for an idle one.
func DPStep(d DPRank, p *engine.BatchPlan, logits []float32, check func() error, set func(rows int, graph DPGraph), forward, idle func() error) error {
	rows, mine := DPRows(d.Name, p, logits, d.Rank, d.Size, d.Rows)
	if mine == nil && p.NumTokens() > 0 {
		mine = check()
	}
	var can, held bool
	if mine == nil && d.Graph != nil {
		can, held = d.Graph(rows)
	}
	graph, err := AgreeDPStep(d.Host, mine, can, held)
	if err != nil {
		return err
	}
	if d.MoE != nil {
		d.MoE.MaskReal = graph != DPEager
	}
	set(rows, graph)
	if p.NumTokens() > 0 {
		return forward()
	}
	return idle()
}

// DPGraphPlan reports whether plan p of a dp rank can run as the decode graph of rows
// rows a rank among buckets: its Group padded the step to those rows (DPStep.Pad, which is
// 0 for a step that is not all decode), and it is an idle plan or one token and one logits
// row per sequence, in order, at most rows of them.
func DPGraphPlan(p *engine.BatchPlan, rows int, buckets []int) bool {
	pad := rows
	if pad <= 0 || int(p.DP.Pad) != pad || !slices.Contains(buckets, pad) {
		return false
	}
	n := p.NumTokens()
	if n == 0 {
		return true
	}
	if len(p.ReqIDs) != n || n > pad || len(p.LogitsIndices) != n || len(p.QueryStart) != n+1 {
		return false
	}
	for i := range n {
		if p.QueryStart[i+1]-p.QueryStart[i] != 1 || p.LogitsIndices[i] != int32(i) {
			return false
		}
	}
	return true
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
		return GroupRank{Device: dev, Pool: pool, Close: run.Close, SetComm: func(c *cudart.Comm) error { setComm(run, c); return nil }, Watchdog: opts.Watchdog}, nil
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

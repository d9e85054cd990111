package glm5flash

import (
	"errors"
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
)

// DP-attention on the GPU, as deepseek-v4-flash's (its gpu_dp.go): each dp rank is a
// GPURunner on a device of its own with an engine and a device pool of its own
// (core/dist/dp's Group steps them together), attending only its own plan's rows (its KDA
// and MLA layers, its dense MLPs) with the replicated weights; its MoE layers run
// expert-parallel over the dp group, each rank holding its range of the routed experts,
// the rows exchanged over NCCL by the gather or the all-to-all dispatch
// (gpurunner.DPMoE). A rank with no work (an idle plan) runs the MoE layers' exchanges
// alone. With the gather exchange decode steps replay CUDA graphs on every rank at once,
// as deepseek-v4-flash's do (core/dist/dp pads an all-decode step to a bucket of the
// runners' GraphBuckets, the ranks agree each can run it as that bucket's graph,
// gpurunner.AgreeDPStep, and an idle rank runs the graph of padding rows alone,
// idleGraph); every other step, and every step of the all-to-all exchange, runs eagerly
// on every rank. With drafts every rank drafts with its MTP layer on the device (DPDraft),
// the layer's exchanges evened out over the ranks.

// moeDP is moe under DP-attention: out [n, D] for this rank's n rows of x (0 on an idle
// rank), exchanged with the other ranks' by the run's dispatch (gpurunner.DPMoE), at
// par.dpRows rows a rank under the gather one.
func (g *gpuModel) moeDP(c *cudart.Ctx, e *gpuMoE, out, x cudart.DevicePtr, n int) error {
	g.par.dpExchanges++
	f := gpurunner.DPMoEFuncs{
		Route:   func(n int) error { return g.route(c, e, x, n) },
		Experts: func(m cuda.MaskedMoE, x cudart.DevicePtr) error { return g.runHeld(c, e, m, x) },
		Shared:  func(dst cudart.DevicePtr, n int) error { return g.mlp(c, &e.shared, dst, x, n) },
	}
	return g.w.dp.Forward(c, g.s, g.kk, f, out, x, n, g.par.dpRows)
}

// idleDP is an idle dp rank's step: every MoE layer's exchange with padding rows alone
// (the dense layers have no collective under DP-attention).
func (g *gpuModel) idleDP(c *cudart.Ctx) error {
	w := &g.w
	for li := range g.layers {
		if l := &g.layers[li]; l.dense == nil {
			if err := g.moeDP(c, l.moe, w.ffn, w.x, 0); err != nil {
				return fmt.Errorf("gpu: idle step: layer %d: %w", li, err)
			}
		}
	}
	return c.Synchronize()
}

// DPForward is the forward of a dp rank (a runner of OpenGPUDPRanks) under core/dist/dp's
// Group, as TextRunner.DPForward on the CPU: p.DP must name this rank of the group
// (gpurunner.DPRows). A plan with tokens runs as the runner's forward does, its MoE
// layers exchanging its rows with the other ranks'; an idle plan runs only the MoE
// layers' exchanges. A step one rank refuses every rank refuses (gpurunner.AgreeDP).
func (r *GPURunner) DPForward(p *engine.BatchPlan, logits []float32) error {
	par := r.g.par
	if par == nil || !par.dp {
		return fmt.Errorf("%s on the GPU: DPForward on a runner not opened for DP-attention (OpenGPUDPRanks)", Name)
	}
	d := gpurunner.DPRank{Name: Name, Rank: par.rank, Size: par.size, Rows: r.g.maxTokens, Host: par.host,
		Graph: func(rows int) (bool, bool) { return r.g.dpGraphable(p, rows) }, MoE: r.g.w.dp}
	return gpurunner.DPStep(d, p, logits, func() error { return r.checkPlan(p, logits) },
		func(rows int, graph gpurunner.DPGraph) { par.dpRows, par.dpGraph = rows, graph },
		func() error { return r.forward(p, logits) }, func() error {
			if par.dpGraph != gpurunner.DPEager {
				return r.dev.Do(r.g.idleGraph)
			}
			return r.dev.Do(r.g.idleDP)
		})
}

// dpGraphable reports whether this dp rank can run plan p as the decode graph of rows
// rows (gpurunner.DPGraphPlan: the Group padded the all-decode step to that bucket), its
// graph not one whose capture failed (nor to be dropped: the graphs are of another pool's
// arena, graphsOnArena), and whether it holds that graph.
func (g *gpuModel) dpGraphable(p *engine.BatchPlan, rows int) (can, held bool) {
	gr := g.graphs
	key := cudart.GraphKey{Kind: cudart.GraphDecode, Bucket: rows}
	if gr == nil || g.pool == nil || g.L.kda < 0 || g.mtp != nil || !gpurunner.DPGraphPlan(p, rows, gr.buckets) {
		return false, false // a drafting rank's steps run eagerly
	}
	if gr.arena != g.arena {
		return true, false // graphsOnArena drops them all: captured anew
	}
	if gr.failed[key] {
		return false, false
	}
	_, held = gr.cache.Get(key)
	return true, held
}

// DPDraft is the draft step of a dp rank that drafts (OpenGPUDPRanks with drafts), for
// core/dist/dp's Rank.Draft, as deepseek-v4-flash's: on a busy rank's plan and result the
// MTP step as on one GPU (mtpDraft: the layer over the rows whose next token is known,
// then drafts−1 chained rounds), its MTP layer's MoE exchanging this rank's rows with the
// other ranks'; every rank runs exactly drafts of those exchanges per step, an idle rank
// or one with fewer draft rows running the missing ones with no rows, a rank whose draft
// failed too before it returns the error (so that no peer waits in them). The exchanges
// pad to twice the step's rows, at most the workspace's (workRows: the MTP layer's rows
// are the step's and one more per sequence).
func (r *GPURunner) DPDraft(p *engine.BatchPlan, res *engine.StepResult) error {
	par := r.g.par
	if par == nil || !par.dp || r.drafts == 0 {
		return fmt.Errorf("%s on the GPU: DPDraft on a runner not opened for DP-attention with drafts", Name)
	}
	g := r.g
	par.dpRows = min(2*par.dpRows, g.workRows())
	g.w.dp.MaskReal = false // the draft steps run eagerly, their padding masked on the host
	before := par.dpExchanges
	var derr error
	if p.NumSeqs() > 0 {
		derr = r.mtpDraft(p, res)
	}
	err := r.dev.Do(func(c *cudart.Ctx) error {
		ran := par.dpExchanges - before
		if ran > r.drafts {
			return fmt.Errorf("%s on the GPU: the draft step ran %d MTP exchanges, want at most %d", Name, ran, r.drafts)
		}
		for ; ran < r.drafts; ran++ {
			if err := g.moeDP(c, g.mtp.moe, g.w.ffn, g.w.x, 0); err != nil {
				return fmt.Errorf("gpu: draft step: mtp: %w", err)
			}
		}
		return c.Synchronize()
	})
	return errors.Join(derr, err)
}

// Draft is dp rank r's draft step for a core/dist/dp Group (Rank.Draft; nil when the
// ranks do not draft): its runner's DPDraft under the rank's watchdog.
func (g *GPUDPRanks) Draft(r int) func(p *engine.BatchPlan, res *engine.StepResult) error {
	if g.Runners[r].drafts == 0 {
		return nil
	}
	return func(p *engine.BatchPlan, res *engine.StepResult) error {
		return g.Step(r, func() error { return g.Runners[r].DPDraft(p, res) })
	}
}

// DPDraft is GPURunner.DPDraft under the rank's watchdog; nil when the rank does not
// draft.
func (g *GPUDPRank) DPDraft() func(p *engine.BatchPlan, res *engine.StepResult) error {
	if g.drafts == 0 {
		return nil
	}
	return func(p *engine.BatchPlan, res *engine.StepResult) error {
		return g.proc.Step(func() error { return g.GPURunner.DPDraft(p, res) })
	}
}

// idleGraph is an idle dp rank's step when every rank runs the step as the decode graph
// of par.dpRows rows: that graph, every row padding (the spare state), its logits dropped.
func (g *gpuModel) idleGraph(c *cudart.Ctx) error {
	g.Stats.IdleGraph++
	_, err := g.forwardGraph(c, g.par.dpRows, nil, nil)
	return err
}

// DPIdleGraphs returns how many idle steps the dp rank ran as a decode graph of padding
// rows (idleGraph) rather than eagerly.
func (r *GPURunner) DPIdleGraphs() int { return r.g.Stats.IdleGraph }

// GPUDPRanks are the dp ranks OpenGPUDPRanks opens, one GPURunner and device pool each,
// and the NCCL communicator their MoE layers exchange rows on.
type GPUDPRanks struct {
	*gpurunner.DPRanks[*GPURunner]
}

// OpenGPUDPRanks opens len(data) dp ranks of the text model in dir (OpenGPULayout's
// directory: a checkpoint, of which each rank reads its experts, or a config for the
// seeded random weights, built once and cut) for DP-attention on the GPU with exchange d
// (gpurunner.DPMoE), each rank drafting drafts tokens a step with its MTP head (0: none;
// Draft): rank r on GPU opts.Ordinal+r where the driver
// sees that many, else every rank on opts.Ordinal, fp32 (but the KDA projections a
// checkpoint ships in bf16), with a device pool of cacheBytes of its own (0 = 256 MiB)
// and, for its model's CPU part, data[r] (the dp group's data communicator). Unless
// opts.Eager, the gather exchange's decode steps replay CUDA graphs (dpGraphs; give the
// Group the ranks' GraphBuckets); opts.Limits apply to every rank. Each rank's forward is its runner's
// DPForward under a core/dist/dp Group. Close closes the devices.
func OpenGPUDPRanks(dir string, cacheBytes int64, opts gpurunner.Options, d Dispatch, drafts int, data []dist.Communicator) (*GPUDPRanks, error) {
	size := len(data)
	fail := func(err error) (*GPUDPRanks, error) {
		return nil, fmt.Errorf("%s: DP-attention over %d GPUs: %w", Name, size, err)
	}
	if err := gpurunner.CheckDPGroup(data); err != nil {
		return fail(err)
	}
	if err := gpurunner.Available(opts.Ordinal); err != nil {
		return fail(err)
	}
	open, err := gpuDPOpener(dir, size, d, drafts)
	if err != nil {
		return fail(err)
	}
	ranks, err := gpurunner.OpenDPRanks(Name, opts, size, func(r int, dev *cudart.Device, cache *cudart.KernelCache, lim gpurunner.Limits) (*GPURunner, *kvslab.Pool, error) {
		return open(r, data[r], dev, cache, lim, cacheBytes)
	}, setDPComm)
	if err != nil {
		return fail(err)
	}
	g := &GPUDPRanks{ranks}
	graphs := dpGraphs(opts, d)
	for _, run := range g.Runners {
		if err := run.UseGraphs(graphs, opts.Log); err != nil {
			g.Close()
			return fail(err)
		}
	}
	if opts.Log != nil {
		fmt.Fprintf(opts.Log, "%s GPU DP-attention over %d ranks (experts %v, the %s exchange), %s: %s\n", Name, size, g.Experts(), d, gpurunner.DPStepsWord(graphs), g.Runners[0].Describe())
	}
	return g, nil
}

// dpGraphs reports whether dp ranks opened with opts for exchange d replay decode graphs:
// unless opts.Eager, by the gather exchange.
func dpGraphs(opts gpurunner.Options, d Dispatch) bool { return !opts.Eager && d == DispatchGather }

// Forward is dp rank r's forward for a core/dist/dp Group: its runner's DPForward under
// the rank's watchdog (gpurunner.DPRanks.Step: past Options.Watchdog its NCCL communicator
// is aborted and the step fails).
func (g *GPUDPRanks) Forward(r int) func(p *engine.BatchPlan, logits []float32) error {
	return func(p *engine.BatchPlan, logits []float32) error {
		return g.Step(r, func() error { return g.Runners[r].DPForward(p, logits) })
	}
}

// GraphBuckets returns the decode buckets the ranks replay graphs for (nil: eager), the
// core/dist/dp Group's Options.GraphBuckets, which pads all-decode steps to them.
func (g *GPUDPRanks) GraphBuckets() []int { return g.Runners[0].GraphBuckets() }

// gpuDPOpener checks the model in dir for DP-attention over size GPU ranks with exchange d
// and returns what opens dp rank r of them (OpenGPUDPRanks' and JoinGPUDPRank's): its
// part of the weights (its experts read from a checkpoint, or cut from the seeded random
// weights, built once), a GPURunner on dev over data (the dp group's host communicator)
// and a device pool of cacheBytes.
func gpuDPOpener(dir string, size int, d Dispatch, drafts int) (func(r int, data dist.Communicator, dev *cudart.Device, cache *cudart.KernelCache, lim gpurunner.Limits, cacheBytes int64) (*GPURunner, *kvslab.Pool, error), error) {
	if d != DispatchGather && d != DispatchAllToAll {
		return nil, fmt.Errorf("dispatch %d", d)
	}
	if drafts < 0 {
		return nil, fmt.Errorf("%d drafts per step", drafts)
	}
	c, err := LoadTextConfig(dir)
	if err != nil {
		return nil, err
	}
	l := Layout{EP: size, Dispatch: d}
	if err := l.Check(c); err != nil {
		return nil, err
	}
	var whole *TextWeights
	if ck, err := weights.Open(dir); err == nil {
		ck.Close() // each rank reads its experts
	} else if !errors.Is(err, weights.ErrNotFound) {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	} else if whole, err = randomWeights(dir, c, 0); err != nil {
		return nil, err
	}
	gopts := GPUOptions{KDAWeights: shippedKDAType(dir, c)}
	return func(r int, data dist.Communicator, dev *cudart.Device, cache *cudart.KernelCache, lim gpurunner.Limits, cacheBytes int64) (*GPURunner, *kvslab.Pool, error) {
		p := gpuRankPart(c, l, r)
		w, err := loadPartWeights(dir, c, 0, p, whole)
		if err != nil {
			return nil, nil, err
		}
		if drafts == 0 {
			w.mtp = nil // not drafting: the head is not needed
		}
		p.comm, p.dp = data, true
		if err := checkGPURankWeights(c, w, &p); err != nil {
			return nil, nil, err
		}
		m := &TextModel{Config: gpuRankConfig(c, p), W: w, par: p}
		rows := min(lim.MaxRows, lim.MaxTokens)
		if drafts > 0 { // a verify step's rows: 1+drafts a sequence
			rows = min(max(rows, lim.MaxSeqs*(1+drafts)), lim.MaxTokens)
		}
		o := gopts
		o.Drafts = drafts
		run, err := NewGPURunner(m, dev, cache, lim.MaxSeqs, lim.MaxTokens, rows, min(c.MaxPositionEmbeddings, 4096), o)
		if err != nil {
			return nil, nil, err
		}
		pool, err := run.NewPool(cacheBytes)
		if err != nil {
			run.Close()
			return nil, nil, err
		}
		return run, pool, nil
	}, nil
}

// setDPComm gives a dp rank's runner the NCCL communicator its MoE layers exchange on.
func setDPComm(run *GPURunner, comm *cudart.Comm) { run.g.par.comm, run.g.w.dp.Comm = comm, comm }

// GPUDPRank is one dp rank of DP-attention on the GPU in a process of its own
// (JoinGPUDPRank): its runner (whose DPForward runs its plans) and its end of the
// group's NCCL communicator. Close frees both and the device.
type GPUDPRank struct {
	*GPURunner
	Pool *kvslab.Pool
	proc *gpurunner.ProcRank
}

// Close frees the rank's NCCL communicator, its runner and its device.
func (g *GPUDPRank) Close() error { return g.proc.Close() }

// DPForward is GPURunner.DPForward under the rank's watchdog (gpurunner.Watchdog): a step
// past Options.Watchdog, or one in flight when Abort is called, aborts the rank's NCCL
// communicator and fails.
func (g *GPUDPRank) DPForward(p *engine.BatchPlan, logits []float32) error {
	return g.proc.Step(func() error { return g.GPURunner.DPForward(p, logits) })
}

// Abort aborts the rank's NCCL communicator (gpurunner.ProcRank.Abort).
func (g *GPUDPRank) Abort(why error) { g.proc.Abort(why) }

// JoinGPUDPRank opens dp rank data.Rank() of data.Size() of the model in dir for
// DP-attention on the GPU as a process of its own on GPU opts.Ordinal, as
// deepseek-v4-flash's JoinGPUDPRank: OpenGPUDPRanks' rank r, meeting the others over
// hello (waits as long as a rank may take to open; gpurunner.JoinPeerRank: rank 0's NCCL
// id and pool geometry, every rank's outcome, the NCCL join), data the dp group's host
// communicator, its MoE layers exchanging rows with theirs on that NCCL
// communicator, its own engine's plans run through DPForward. Its decode steps replay
// graphs as OpenGPUDPRanks' do (every rank must be opened with the same opts.Eager).
func JoinGPUDPRank(dir string, cacheBytes int64, opts gpurunner.Options, d Dispatch, drafts int, hello, data dist.Communicator) (*GPUDPRank, error) {
	rank, size := data.Rank(), data.Size()
	fail := func(err error) (*GPUDPRank, error) {
		return nil, fmt.Errorf("%s: DP-attention rank %d of %d: %w", Name, rank, size, err)
	}
	if size < 2 {
		return fail(fmt.Errorf("want 2 or more ranks"))
	}
	open, err := gpuDPOpener(dir, size, d, drafts)
	if err != nil {
		return fail(err)
	}
	graphs := dpGraphs(opts, d)
	run, pool, proc, err := gpurunner.JoinDPRank(Name, opts, hello, cacheBytes, func(dev *cudart.Device, cache *cudart.KernelCache, lim gpurunner.Limits, bytes int64) (*GPURunner, *kvslab.Pool, error) {
		run, pool, err := open(rank, data, dev, cache, lim, bytes)
		if err == nil {
			// Before the ranks report their outcomes, so a failure fails every rank.
			if err = run.UseGraphs(graphs, opts.Log); err != nil {
				run.Close()
				return nil, nil, err
			}
		}
		return run, pool, err
	}, func(run *GPURunner) { run.ownsDev = true }, setDPComm)
	if err != nil {
		return fail(err)
	}
	if opts.Log != nil && rank == 0 {
		fmt.Fprintf(opts.Log, "%s GPU DP-attention over %d ranks in processes of their own (the %s exchange), %s: %s\n", Name, size, d, gpurunner.DPStepsWord(graphs), run.Describe())
	}
	return &GPUDPRank{GPURunner: run, Pool: pool, proc: proc}, nil
}

// Experts returns the routed experts each rank holds, [lo, hi).
func (g *GPUDPRanks) Experts() [][2]int {
	out := make([][2]int, len(g.Runners))
	for r, run := range g.Runners {
		out[r] = [2]int{run.g.par.lo, run.g.par.hi}
	}
	return out
}

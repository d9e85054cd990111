package gpurunner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"
	"unsafe"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dspark"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
)

// Options configure a GPU runner.
type Options struct {
	// Ordinal is the GPU to run on.
	Ordinal int
	// NUMA binds the process and its pinned host buffers to a NUMA node (the GPU's, by
	// default; see cudart.BindNUMA).
	NUMA cudart.NUMAMode
	// Limits size the workspace: the engine's MaxBatchTokens and MaxSeqs (zero: 8192 and
	// 256, the engine's defaults), and the logits rows (zero: MaxSeqs).
	Limits Limits
	// CacheBytes is the device KV cache (0: 4 GiB, or half the memory left after the
	// weights and the workspace when that is less).
	CacheBytes int64
	// Eager turns CUDA graphs off: every step launches its kernels.
	Eager bool
	// KernelCache is the compiled-kernel directory ("" = cudart's default).
	KernelCache string
	// Progress reports the weights upload (nil: silent; weights.TerminalProgress() draws
	// it on a terminal).
	Progress weights.ProgressFunc
	// Log receives one-line notes: the NUMA choice, graph captures that failed.
	Log io.Writer
	// Watchdog bounds each step of a rank of a group whose collectives run on NCCL
	// (0: DefaultWatchdog): past it the rank's communicator is aborted and the step fails
	// (Watchdog), where NCCL would wait for a dead or hung peer for good.
	Watchdog time.Duration
	// DSpark is the drafter UseDSpark will be given, when known before the pool is cut:
	// the pool then holds its context group (dspark.Drafter.CacheGroup) after the model's,
	// so that prefix hits and preempted requests are drafted at once (see UseDSpark).
	DSpark *dspark.Drafter
}

func (o *Options) limits() Limits {
	l := o.Limits
	if l.MaxTokens == 0 {
		l.MaxTokens = 8192
	}
	if l.MaxSeqs == 0 {
		l.MaxSeqs = min(256, l.MaxTokens)
	}
	if l.MaxRows == 0 {
		l.MaxRows = l.MaxSeqs
	}
	return l
}

// Runner runs a dense model on one GPU for the engine. Steps whose rows the sampling
// kernel covers (greedy, temperature, top-k, top-p, min-p, seeded, up to 32 logprob
// alternatives) sample on the device, under the grammar token masks of constrained rows
// (RunnerInfo.TokenMasks): only token ids and logprobs come back. Steps with drafts, penalties, logit biases, min-tokens masks or prompt logprobs bring their logits
// rows back to core/cpurunner, which samples them exactly as the CPU runners do. Execute
// is for the engine's one goroutine.
type Runner struct {
	cpu    *cpurunner.Runner
	info   engine.RunnerInfo
	dev    *cudart.Device
	kern   *cuda.Kernels
	blas   *cudart.Blas
	model  *Dense
	arena  *cudart.DeviceArena
	pool   *kvslab.Pool
	stream *cudart.Stream
	limits Limits
	copies []arenaCopy // the step's cache ops as arena copies (cacheOps)

	host    [2]*cudart.HostBuffer // plan uploads, alternating
	masks   [2]*cudart.HostBuffer // token mask uploads, alternating with host
	cur     int
	out     *cudart.HostBuffer // sampled ids, logprobs and alternatives come back here
	buckets Buckets
	eager   PlanLayout
	layouts map[Shape]*PlanLayout
	graphs  *cudart.GraphCache
	failed  map[cudart.GraphKey]bool
	noGraph bool
	capture bool
	log     io.Writer
	res     engine.StepResult
	dspark  *dsparkTap // UseDSpark's: every step is sampled on the host, then drafted
	kcache  *cudart.KernelCache

	// NUMA is what the NUMA binding decided.
	NUMA cudart.NUMADecision
	// Stats count the steps by how they ran.
	Stats StepStats
}

// StepStats count a runner's steps by how they ran: replaying a graph or eagerly, sampled
// on the device or on the host; and, of a context-parallel rank (NewDenseCP), split over
// the group (counted in Eager too).
type StepStats struct{ Graph, Eager, DeviceSampled, HostSampled, Split int }

var (
	_ engine.Runner            = (*Runner)(nil)
	_ cpurunner.LogitsCapturer = (*Runner)(nil)
)

// CaptureLogits implements cpurunner.LogitsCapturer (`generate --logits-out`): every
// later step brings the logits of all its token rows back and samples on the host. The
// rows must fit the runner's logits rows (Options.Limits.MaxRows).
func (r *Runner) CaptureLogits(fn func(cpurunner.LogitsRow)) {
	r.cpu.CaptureLogits(fn)
	r.capture = fn != nil
}

// ErrNoDevice reports that no GPU runner can start here: no driver, no GPU, or no CUDA
// library; it wraps the cudart error that says which.
var ErrNoDevice = errors.New("gpurunner: no usable CUDA device")

// Available reports, as an error matching ErrNoDevice, why GPU ordinal cannot run a
// model here: no driver, or no such GPU. A model opener calls it before loading weights
// it would only upload.
func Available(ordinal int) error {
	n, err := cudart.DeviceCount()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNoDevice, err)
	}
	if ordinal < 0 || ordinal >= n {
		return fmt.Errorf("%w: GPU %d asked for, the driver sees %d", ErrNoDevice, ordinal, n)
	}
	return nil
}

// NewDense uploads a dense model to GPU opts.Ordinal and returns its runner with a device
// cache pool for engine.Config.Pool.
func NewDense(cfg *DenseConfig, w *DenseWeights, opts Options) (*Runner, *kvslab.Pool, error) {
	if err := cfg.Check(); err != nil {
		return nil, nil, err
	}
	if err := w.Check(cfg); err != nil {
		return nil, nil, err
	}
	if g := cfg.Heads / cfg.KVHeads; g > cuda.MaxDecodeGroup {
		return nil, nil, fmt.Errorf("gpurunner: %d query heads per kv head; the decode attention kernel takes at most %d", g, cuda.MaxDecodeGroup)
	}
	lim := opts.limits()
	if err := lim.Check(); err != nil {
		return nil, nil, err
	}
	if err := Available(opts.Ordinal); err != nil {
		return nil, nil, err
	}
	r := &Runner{limits: lim, noGraph: opts.Eager, log: opts.Log, layouts: map[Shape]*PlanLayout{}, failed: map[cudart.GraphKey]bool{}}
	if r.log == nil {
		r.log = io.Discard
	}
	ok := false
	defer func() {
		if !ok {
			r.Close()
		}
	}()
	var err error
	if r.dev, err = cudart.OpenDevice(opts.Ordinal); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrNoDevice, err)
	}
	if r.NUMA, err = cudart.BindNUMA(opts.NUMA, r.dev.Info); err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(r.log, "gpu: %s (%s), %s\n", r.dev.Info.Name, r.dev.Info.Arch(), r.NUMA) // NUMA.String says "numa …"
	kc, err := cudart.OpenKernelCache(opts.KernelCache)
	if err != nil {
		return nil, nil, err
	}
	r.kcache = kc
	if r.kern, err = cuda.Load(r.dev, kc); err != nil {
		return nil, nil, fmt.Errorf("gpurunner: kernels: %w", err)
	}
	if r.blas, err = cudart.NewBlas(r.dev); err != nil {
		return nil, nil, fmt.Errorf("gpurunner: %w", err)
	}
	ws, err := NewWorkspace(cfg, lim)
	if err != nil {
		return nil, nil, err
	}
	free, _, err := r.dev.MemInfo()
	if err != nil {
		return nil, nil, err
	}
	cacheBytes := opts.CacheBytes
	left := free - NewWeightLayout(cfg).Size - ws.Size
	if cacheBytes == 0 {
		cacheBytes = min(4<<30, left/2)
	}
	if cacheBytes <= 0 || cacheBytes > left {
		return nil, nil, fmt.Errorf("gpurunner: a KV cache of %d bytes does not fit the %d bytes left on GPU %d after %d bytes of weights and a %d-byte workspace",
			cacheBytes, max(left, 0), opts.Ordinal, NewWeightLayout(cfg).Size, ws.Size)
	}
	groups := CacheGroups(cfg)
	if opts.DSpark != nil {
		groups = append(groups, opts.DSpark.CacheGroup(cfg.PageTokens))
	}
	z, err := kvslab.Size(kvslab.Config{Groups: groups}, cacheBytes, 1)
	if err != nil {
		return nil, nil, err
	}
	// DSpark's block pages follow the pool's slabs in the arena (dsparkScratchSlabs).
	scratch, err := dsparkScratchSlabs(opts.DSpark, groups, &z, lim.MaxSeqs)
	if err != nil {
		return nil, nil, err
	}
	if r.arena, err = cudart.NewDeviceArena(r.dev, int64(z.Slabs+scratch)*z.SlabBytes); err != nil {
		return nil, nil, err
	}
	pool, err := kvslab.New(kvslab.Config{Groups: groups}, poolArena{r.arena, int64(z.Slabs) * z.SlabBytes})
	if err != nil {
		return nil, nil, err
	}
	r.pool = pool
	r.buckets = Buckets{Prefill: PrefillBuckets(lim.MaxTokens), MaxPages: cfg.MaxPages(), Groups: 1, Room: ws.PlanLayout.Dims}
	if !r.noGraph {
		r.buckets.Decode = DecodeBuckets(lim.MaxSeqs)
	}
	// Room for every bucket with and without device sampling, and decode graphs of a
	// second tokens-per-sequence variant, so that nothing is evicted in steady state.
	if r.graphs, err = cudart.NewGraphCache(4*len(r.buckets.Decode) + 2*len(r.buckets.Prefill) + 1); err != nil {
		return nil, nil, err
	}
	err = r.dev.Do(func(c *cudart.Ctx) error {
		var err error
		if r.stream, err = c.NewStream(); err != nil {
			return err
		}
		r.arena.SetStream(r.stream)
		if r.model, err = newDense(c, cfg, w, lim, r.kern, r.blas, pool, r.arena, opts.Progress); err != nil {
			return err
		}
		for i := range r.host {
			if r.host[i], err = c.AllocHostOn(ws.PlanLayout.Size, r.NUMA.Node); err != nil {
				return err
			}
			if r.masks[i], err = c.AllocHostOn(ws.TokenMask.Len, r.NUMA.Node); err != nil {
				return err
			}
		}
		r.out, err = c.AllocHostOn(int64(lim.MaxRows)*(8+2*4*MaxTop), r.NUMA.Node)
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("gpurunner: %s on GPU %d: %w", cfg.Name, opts.Ordinal, err)
	}
	r.info = engine.RunnerInfo{
		Name: cfg.Name, VocabSize: cfg.Vocab, MaxContext: cfg.MaxContext, EOS: cfg.EOS,
		CacheGroups: groups, GraphBuckets: r.buckets.Decode,
		// The plan's page copies go on the runner's stream before its forward (cacheOps).
		ExecutesCacheOps: true,
		// The sampling kernel applies them; a step sampled on the host has cpurunner's.
		TokenMasks: true,
	}
	r.cpu = cpurunner.New(r.info, cpurunner.ForwardFunc(r.forwardLogits))
	ok = true
	return r, pool, nil
}

// Info describes the runner to the engine.
func (r *Runner) Info() engine.RunnerInfo { return r.info }

// Execute runs one plan: its cache ops, then its forward.
func (r *Runner) Execute(ctx context.Context, plan *engine.BatchPlan) (engine.StepResult, error) {
	if err := ctx.Err(); err != nil {
		return engine.StepResult{}, err
	}
	if err := r.cacheOps(plan); err != nil {
		return engine.StepResult{}, err
	}
	if r.capture || r.dspark != nil || !deviceSamples(plan) {
		r.Stats.HostSampled++
		return r.cpu.Execute(ctx, plan)
	}
	rows := len(plan.LogitsIndices)
	anyLP, anyTop := logprobsWanted(plan)
	// The host buffer holds [R] ids, [R] logprobs, [R, MaxTop] ids and [R, MaxTop] logprobs.
	m, R := r.model, int64(r.limits.MaxRows)
	err := r.step(plan, true, func(c *cudart.Ctx) error {
		n := int64(rows) * 4
		err := c.CopyDtoHAsync(r.out.Bytes[:n], m.work.Ptr.Add(m.ws.Sampled.Off), r.stream)
		if err == nil && anyLP {
			err = c.CopyDtoHAsync(r.out.Bytes[4*R:4*R+n], m.work.Ptr.Add(m.ws.Logprobs.Off), r.stream)
		}
		if err == nil && anyTop {
			err = firstErr(
				c.CopyDtoHAsync(r.out.Bytes[8*R:8*R+n*MaxTop], m.work.Ptr.Add(m.ws.TopIDs.Off), r.stream),
				c.CopyDtoHAsync(r.out.Bytes[(8+4*MaxTop)*R:(8+4*MaxTop)*R+n*MaxTop], m.work.Ptr.Add(m.ws.TopLogprobs.Off), r.stream),
			)
		}
		return err
	})
	if err != nil {
		return engine.StepResult{}, err
	}
	r.Stats.DeviceSampled++
	ids := viewInt32(r.out.Bytes[:4*R])
	lps := viewFloat32(r.out.Bytes[4*R : 8*R])
	topIDs := viewInt32(r.out.Bytes[8*R : (8+4*MaxTop)*R])
	topLPs := viewFloat32(r.out.Bytes[(8+4*MaxTop)*R : (8+8*MaxTop)*R])
	if err := checkSampled(ids[:rows], r.info.VocabSize); err != nil {
		return engine.StepResult{}, err
	}
	fillResult(&r.res, plan, anyLP, ids, lps, topIDs, topLPs)
	return r.res, nil
}

// checkSampled reports a token the device sampled outside [0, vocab): the engine indexes
// its tables by it, so one must never reach it (the kernel gives every row a token of
// the vocabulary, a row of NaN logits token 0; this guards against a kernel bug).
func checkSampled(ids []int32, vocab int) error {
	for i, id := range ids {
		if id < 0 || int(id) >= vocab {
			return fmt.Errorf("gpurunner: the device sampled token %d for logits row %d, outside the vocabulary of %d", id, i, vocab)
		}
	}
	return nil
}

// fillResult builds the StepResult of a step sampled on the device from its outputs per
// logits row: the token ids, their logprobs and MaxTop alternatives of each row. A
// sequence with a row accepts its one token; logprobs are returned when anyLP (any
// sequence asks: logprobsWanted).
func fillResult(res *engine.StepResult, plan *engine.BatchPlan, anyLP bool, ids []int32, lps []float32, topIDs []int32, topLPs []float32) {
	b := plan.NumSeqs()
	res.Reset(b)
	for i := 0; i < b; i++ {
		a, e := plan.LogitsStart[i], plan.LogitsStart[i+1]
		if e == a {
			continue
		}
		res.Accepted[i] = 1
		res.Tokens = append(res.Tokens, ids[a])
		if anyLP {
			res.Logprobs = append(res.Logprobs, lps[a])
		}
		if n := int(plan.Logprobs[i]); n > 0 {
			res.TopTokens = append(res.TopTokens, topIDs[int(a)*MaxTop:int(a)*MaxTop+n]...)
			res.TopLogprobs = append(res.TopLogprobs, topLPs[int(a)*MaxTop:int(a)*MaxTop+n]...)
		}
	}
}

func viewInt32(b []byte) []int32 { return unsafe.Slice((*int32)(unsafe.Pointer(&b[0])), len(b)/4) }

func viewUint32(b []byte) []uint32 { return unsafe.Slice((*uint32)(unsafe.Pointer(&b[0])), len(b)/4) }

func viewFloat32(b []byte) []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// logprobsWanted reports whether any sequence of plan asks for its token's logprob, and
// whether any asks for alternatives.
func logprobsWanted(plan *engine.BatchPlan) (anyLP, anyTop bool) {
	for _, n := range plan.Logprobs {
		anyLP, anyTop = anyLP || n >= 0, anyTop || n > 0
	}
	return anyLP, anyTop
}

// deviceSamples reports whether the sampling kernel covers every row of plan: one row per
// sequence (no drafts to verify), at most MaxTop alternatives, and none of the features
// only engine.Sampler applies (penalties, logit bias, min-tokens masks, prompt logprobs).
func deviceSamples(plan *engine.BatchPlan) bool {
	if len(plan.LogitBiasStart) > 0 || len(plan.StopIDsStart) > 0 || len(plan.HistoryStart) > 0 || len(plan.PromptLogprobs) > 0 {
		return false
	}
	for i := range plan.ReqIDs {
		if plan.NumDrafts[i] != 0 || plan.Logprobs[i] > MaxTop {
			return false
		}
		if len(plan.PresencePenalty) > 0 && (plan.PresencePenalty[i] != 0 || plan.FrequencyPenalty[i] != 0 || plan.RepetitionPenalty[i] != 1) {
			return false
		}
	}
	return true
}

// forwardLogits is the cpurunner's forward: the step on the device, its float32 logits
// rows copied into logits.
func (r *Runner) forwardLogits(plan *engine.BatchPlan, logits []float32) error {
	n := len(logits)
	if n == 0 {
		return r.step(plan, false, nil)
	}
	return r.step(plan, false, func(c *cudart.Ctx) error {
		return c.CopyDtoHAsync(unsafe.Slice((*byte)(unsafe.Pointer(&logits[0])), 4*n), r.model.work.Ptr.Add(r.model.ws.Logits.Off), r.stream)
	})
}

// step uploads plan, runs the forward (a graph when one fits; sampling on the device with
// sample) and then fetch, and waits.
func (r *Runner) step(plan *engine.BatchPlan, sample bool, fetch func(c *cudart.Ctx) error) error {
	if len(plan.Groups) > 1 { // the forward reads the model's group; DSpark's is dspark.go's
		v := *plan
		v.Groups = plan.Groups[:1]
		plan = &v
	}
	if err := r.checkDims(plan); err != nil {
		return err
	}
	if r.model.cpSplits(plan) {
		return r.cpStepRun(plan, sample, fetch)
	}
	pd := PlanDims(plan)
	sh := r.buckets.Choose(plan, r.limits.MaxSeqs)
	l, err := r.layout(sh)
	if err != nil {
		return err
	}
	host, masks := r.host[r.cur], r.masks[r.cur]
	r.cur ^= 1
	if err := l.Pack(host.Bytes, plan); err != nil {
		return err
	}
	r.model.shardTokens(host.Bytes, l)
	nmask := 0
	if sample {
		var err error
		if nmask, err = r.packMasks(masks.Bytes, plan); err != nil {
			return err
		}
	}
	decodeOnly := sh.Mode != PrefillGraph && pd.Tokens == pd.Seqs
	return r.dev.Do(func(c *cudart.Ctx) error {
		// Execute ends with the stream drained, so the buffer packed two steps ago is free.
		if err := c.CopyHtoDAsync(r.model.planPtr(), host.Bytes[:l.Size], r.stream); err != nil {
			return err
		}
		if nmask > 0 {
			if err := c.CopyHtoDAsync(r.model.work.Ptr.Add(r.model.ws.TokenMask.Off), masks.Bytes[:nmask], r.stream); err != nil {
				return err
			}
		}
		if err := r.run(c, sh, l, decodeOnly, sample); err != nil {
			return err
		}
		if fetch != nil {
			if err := fetch(c); err != nil {
				return err
			}
		}
		return c.Sync(r.stream)
	})
}

// checkDims refuses a plan past the runner's limits (what step refuses before its upload).
func (r *Runner) checkDims(plan *engine.BatchPlan) error {
	pd := PlanDims(plan)
	if ld := r.model.ws.PlanLayout.Dims; pd.Tokens > r.limits.MaxTokens || pd.Seqs > r.limits.MaxSeqs || pd.Rows > r.limits.MaxRows || pd.PagesPerSeq > ld.PagesPerSeq {
		return fmt.Errorf("gpurunner: a step of %d tokens, %d sequences, %d logits rows and %d pages per sequence exceeds the runner's limits %+v (%d pages)",
			pd.Tokens, pd.Seqs, pd.Rows, pd.PagesPerSeq, r.limits, ld.PagesPerSeq)
	}
	return nil
}

// packMasks copies plan's token masks into buf (the workspace's TokenMask as uploaded,
// PlanLayout.MaskStart indexing it) and returns their bytes, 0 for a plan without
// masks. Each constrained row's mask must be the vocabulary's width.
func (r *Runner) packMasks(buf []byte, plan *engine.BatchPlan) (int, error) {
	if len(plan.TokenMask) == 0 {
		return 0, nil
	}
	words := cuda.MaskWords(r.info.VocabSize)
	for i := range plan.NumSeqs() {
		n := int(plan.LogitsStart[i+1] - plan.LogitsStart[i])
		if got := int(plan.TokenMaskStart[i+1] - plan.TokenMaskStart[i]); got != 0 && got != n*words {
			return 0, fmt.Errorf("gpurunner: sequence %d has %d token mask words for %d logits rows, the vocabulary of %d needs %d per row",
				i, got, n, r.info.VocabSize, words)
		}
	}
	n := 4 * len(plan.TokenMask)
	if n > len(buf) {
		return 0, fmt.Errorf("gpurunner: %d token mask words exceed the %d the runner holds", len(plan.TokenMask), len(buf)/4)
	}
	copy(viewUint32(buf[:n]), plan.TokenMask)
	return n, nil
}

// run launches the forward of sh: its graph when one was captured, or eagerly. The first
// step of a graph shape runs eagerly and is then captured for the next ones: the eager
// run makes every cuBLASLt plan (its heuristic query) and loads every kernel module
// (lazy loading) outside the capture, where the driver would refuse such work on the
// capturing thread and leave the shape eager for good.
func (r *Runner) run(c *cudart.Ctx, sh Shape, l *PlanLayout, decodeOnly, sample bool) error {
	key, graph := GraphKey(sh)
	if sample {
		key.Variant |= 1 << 16 // the graph with the sampling kernel
	}
	forward := func() error { return r.model.Forward(c, r.stream, l, decodeOnly, sample) }
	if !graph || r.noGraph || r.failed[key] {
		r.Stats.Eager++
		return forward()
	}
	ok, err := r.graphs.Replay(c, r.stream, key)
	if err != nil {
		return err
	}
	if ok {
		r.Stats.Graph++
		return nil
	}
	r.Stats.Eager++
	if err := forward(); err != nil {
		return err
	}
	// Capturing records the step without running it: the eager run above was this step.
	if _, err := r.graphs.Capture(c, r.stream, key, forward); err != nil {
		r.failed[key] = true
		fmt.Fprintf(r.log, "gpu: %v; that shape runs eagerly\n", err)
	}
	return nil
}

// layout returns the upload layout of sh: one per graph shape, kept (the graph reads its
// addresses), and one reused for eager steps.
func (r *Runner) layout(sh Shape) (*PlanLayout, error) {
	if sh.Mode == Eager {
		if err := r.eager.init(sh.Dims); err != nil {
			return nil, err
		}
		return &r.eager, nil
	}
	if l, ok := r.layouts[sh]; ok {
		return l, nil
	}
	l, err := NewPlanLayout(sh.Dims)
	if err != nil {
		return nil, err
	}
	r.layouts[sh] = &l
	return &l, nil
}

// Close releases the device memory, graphs and device.
func (r *Runner) Close() error {
	if r.dev == nil {
		return nil
	}
	err := r.dev.Do(func(c *cudart.Ctx) error {
		if r.graphs != nil {
			r.graphs.Close(c)
		}
		if r.model != nil {
			r.model.free(c)
		}
		for i, h := range r.host {
			c.FreeHost(h)
			c.FreeHost(r.masks[i])
		}
		c.FreeHost(r.out)
		r.dspark.free(c)
		return c.DestroyStream(r.stream)
	})
	if r.blas != nil {
		r.blas.Close()
	}
	if r.kern != nil {
		r.kern.Close()
	}
	if r.arena != nil {
		r.arena.Close()
	}
	r.dev.Close()
	r.dev = nil
	return err
}

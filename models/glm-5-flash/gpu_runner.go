package glm5flash

import (
	"fmt"
	"io"
	"slices"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/models/glm-5-flash/kernels"
)

// GPURunner serves the text model to core/engine from one CUDA device: gpuModel's
// forward behind core/cpurunner's engine wiring (host sampling on the device's logits),
// as deepseek-v4-flash's GPURunner. The cache is a kvslab pool in device memory (NewPool)
// in the CPU runner's groups and layout, so prefix hits resume from its pages and KDA
// checkpoints; the engine executes the plans' CacheOps on it (page copies on the device,
// DeviceArena.Copy). Each running sequence also has a device slot holding its MLA rows by
// position, which the attention kernels read. With GPUOptions.Drafts it decodes
// speculatively with the MTP layer on the device, as NewMTPTextRunner does on the CPU
// (gpu_verify.go, gpu_mtp.go): the same drafts, the same pool layout. Decode steps replay
// CUDA graphs per batch bucket after UseGraphs (gpu_graphs.go; prefill and drafting steps
// eager). A first cut: fp32 (but GPUOptions.KDAWeights and Weights).
type GPURunner struct {
	*cpurunner.Runner
	Model      *TextModel
	MaxContext int
	dev        *cudart.Device
	kk         *cuda.Kernels
	blas       *cudart.Blas
	g          *gpuModel
	seqs       map[uint64]*gpuSeq
	arenas     []*cudart.DeviceArena // NewPool's, closed by Close
	pt         int
	drafts     int // per step, from the MTP layer (0: no speculative decoding)
	// forceDraft, when set (tests), chooses draft j as TextRunner.forceDraft.
	forceDraft func(promptLen, pos, j int, logits []float32) int32
	// ownsDev: Close closes the device too (OpenGPU opened it).
	ownsDev bool
	closed  bool // Close ran
	opts    GPUOptions
	cpSplit int // steps run split over a cp group (gpu_cp.go)
}

var (
	_ engine.Runner        = (*GPURunner)(nil)
	_ engine.PromptChecker = (*GPURunner)(nil)
)

// GPUOptions are NewGPURunner's choices besides its sizes; the zero value is fp32 without
// drafts.
type GPUOptions struct {
	// Drafts is how many draft tokens the runner proposes per sequence and step with the
	// model's MTP layer on the device (0: no speculative decoding; a checkpoint without
	// the MTP layer is refused, ErrNoMTP): each sequence slot keeps room for the KDA states
	// after as many tokens (gpu_verify.go), and the workspace for the MTP layer's rows.
	Drafts int
	// KDAWeights is the KDA projections' weight type: cudart.F32 (the zero value) or
	// cudart.BF16, as checkpoints ship them even when FP8 (their activations are rounded
	// to bf16, the products accumulate in fp32); every other weight is fp32.
	KDAWeights cudart.DType
	// Weights is the MLPs', the shared and routed experts' and lm_head's weight type:
	// cudart.F32 (the zero value) or cudart.BF16 through core/gpurunner's Linears
	// (gpu_linears.go; activations cast to bf16, fp32 accumulation), and the MTP layer's
	// eh_proj, MoE and own head alike. The router, the mHC mixes and the MLA projections
	// stay fp32 (but Checkpoint's FP8).
	Weights cudart.DType
	// Checkpoint, when set, is m's checkpoint directory: the linears it stores as FP8 with
	// 128×128 blocks are uploaded as stored and run block-scaled FP8 GEMMs (gpu_fp8.go;
	// the others as Weights says). OpenGPU sets it.
	Checkpoint string
	// FP8 chooses the FP8 GEMM path (gpurunner.FP8Auto, the zero value: cuBLASLt's
	// block-scaled FP8 where the device and library have it, else the fallback kernel).
	FP8 gpurunner.FP8Path
	// perExpertFP8 runs FP8 routed experts one linear an expert (the first cut) instead
	// of as banks grouped over the experts: the tests check the banks against it.
	perExpertFP8 bool
}

// NewGPURunner loads the kernels (through cache) and uploads m on dev (fp32, but for
// opts.KDAWeights), for up to slots sequences of up to maxContext tokens (0: the CPU
// runner's default) at once and steps of up to maxTokens rows, maxRows of them sampled.
func NewGPURunner(m *TextModel, dev *cudart.Device, cache *cudart.KernelCache, slots, maxTokens, maxRows, maxContext int, opts GPUOptions) (*GPURunner, error) {
	if maxContext <= 0 {
		maxContext = min(m.Config.MaxPositionEmbeddings, 4096)
	}
	kk, err := cuda.Load(dev, cache)
	if err != nil {
		return nil, fmt.Errorf("%s on the GPU: %w", Name, err)
	}
	blas, err := cudart.NewBlas(dev)
	if err != nil {
		kk.Close()
		return nil, fmt.Errorf("%s on the GPU: %w", Name, err)
	}
	r := &GPURunner{Model: m, MaxContext: maxContext, dev: dev, kk: kk, blas: blas,
		pt: TextPageTokens(m.Config, 0), seqs: map[uint64]*gpuSeq{}, opts: opts}
	err = dev.Do(func(c *cudart.Ctx) error {
		ks, err := kernels.Load(c, cache, dev.Info.Arch())
		if err != nil {
			return err
		}
		// gpuDSA's workspace takes a step's rows as positions: at least maxTokens of them.
		r.g, err = newGPUModel(c, dev, m, kk, ks, blas, slots, maxTokens, maxRows, max(maxContext, maxTokens), r.pt, opts)
		return err
	})
	if err != nil {
		blas.Close()
		kk.Close()
		return nil, fmt.Errorf("%s on the GPU: %w", Name, err)
	}
	c := m.Config
	info := engine.RunnerInfo{Name: Name, VocabSize: c.VocabSize, MaxContext: maxContext, EOS: c.EOSTokenID,
		CacheGroups: r.g.L.groups}
	if r.drafts = opts.Drafts; r.drafts > 0 {
		r.Runner = cpurunner.New(info, gpuDrafter{r})
	} else {
		r.Runner = cpurunner.New(info, cpurunner.ForwardFunc(r.forward))
	}
	return r, nil
}

// UseGraphs turns CUDA graphs for decode steps on or off (gpu_graphs.go: one per batch
// bucket; prefill steps and a runner with drafts stay eager); a failed capture is noted
// on log (nil: dropped) and its shape runs eagerly. OpenGPU turns them on unless
// opts.Eager.
func (r *GPURunner) UseGraphs(on bool, log io.Writer) error {
	if on && r.g.par != nil && r.g.par.allToAll {
		// The all-to-all exchange plans its sends on the host from each step's routes.
		return fmt.Errorf("%s on the GPU: CUDA graphs run the gather exchange only (the all-to-all one plans each step's sends on the host; its steps run eagerly)", Name)
	}
	return r.dev.Do(func(c *cudart.Ctx) error { return r.g.useGraphs(c, on, log) })
}

// GraphBuckets returns the decode batch sizes the runner replays graphs for, nil when its
// steps run eagerly (UseGraphs).
func (r *GPURunner) GraphBuckets() []int {
	if r.g.graphs == nil {
		return nil
	}
	return slices.Clone(r.g.graphs.buckets)
}

// StepCounts returns how many decode steps replayed a graph and how many ran a graph
// bucket's launches eagerly (a bucket's first step, before its capture); other steps are
// not counted.
func (r *GPURunner) StepCounts() (graph, eager int) { return r.g.Stats.Graph, r.g.Stats.Eager }

// PrefillStepCounts is StepCounts for prefill graphs (gpu_prefill_graphs.go): the prefill
// steps that replayed one and those that ran a prefill graph's shape eagerly (its first).
func (r *GPURunner) PrefillStepCounts() (graph, eager int) {
	return r.g.Stats.PrefillGraph, r.g.Stats.PrefillEager
}

// CheckPrompt refuses image and video placeholder tokens, as TextRunner.CheckPrompt.
func (r *GPURunner) CheckPrompt(prompt []int32) error {
	return r.Model.Config.RefuseVisionTokens(prompt)
}

// NewPool builds a pool of bytes bytes (0 = 256 MiB) in the device's memory and binds the
// runner to it (the sequences of an earlier pool are forgotten).
func (r *GPURunner) NewPool(bytes int64) (*kvslab.Pool, error) {
	if bytes == 0 {
		bytes = 256 << 20
	}
	cfg := kvslab.Config{Groups: r.g.L.groups}
	z, err := kvslab.Size(cfg, bytes, 1)
	if err != nil {
		return nil, fmt.Errorf("%s: cache pool: %w", Name, err)
	}
	arena, err := cudart.NewDeviceArena(r.dev, int64(z.Slabs)*z.SlabBytes)
	if err != nil {
		return nil, fmt.Errorf("%s: cache pool: %w", Name, err)
	}
	pool, err := kvslab.New(cfg, arena)
	if err == nil {
		err = r.g.bindPool(pool, arena)
	}
	if err != nil {
		arena.Close()
		return nil, fmt.Errorf("%s: cache pool: %w", Name, err)
	}
	r.arenas = append(r.arenas, arena)
	for id, s := range r.seqs {
		r.g.free(s)
		delete(r.seqs, id)
	}
	return pool, nil
}

// Close frees the device memory and the kernels (and closes the device OpenGPU opened);
// it must not run inside Device.Do. Closing it again does nothing.
func (r *GPURunner) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	r.dev.Do(func(c *cudart.Ctx) error {
		r.g.close(c)
		return nil
	})
	r.blas.Close()
	err := r.kk.Close()
	for _, a := range r.arenas {
		if e := a.Close(); err == nil {
			err = e
		}
	}
	if r.ownsDev {
		if e := r.dev.Close(); err == nil {
			err = e
		}
	}
	return err
}

// forward runs one plan on the device and copies the logits of plan.LogitsIndices' rows.
func (r *GPURunner) forward(p *engine.BatchPlan, logits []float32) error {
	vocab := r.Model.Config.VocabSize
	return r.dev.Do(func(c *cudart.Ctx) error {
		seqs, toks, err := r.bind(p)
		if err != nil {
			return err
		}
		var rows []float32
		if r.cpSplits(p) {
			rows, err = r.g.runCP(c, seqs[0], toks[0], p.LogitsIndices)
			r.cpSplit++
		} else {
			rows, err = r.g.forward(c, seqs, toks, p.LogitsIndices)
		}
		if err != nil {
			return err
		}
		copy(logits, rows[:len(p.LogitsIndices)*vocab])
		return nil
	})
}

// bind frees the slots of plan p's released requests and returns the device sequence of
// each of its sequences, with the step's pages and drafts (a new request takes a free
// slot), and their tokens. More draft tokens than GPUOptions.Drafts are refused.
func (r *GPURunner) bind(p *engine.BatchPlan) ([]*gpuSeq, [][]int32, error) {
	for _, rel := range p.Released {
		if s, ok := r.seqs[rel.ReqID]; ok {
			r.g.free(s)
			delete(r.seqs, rel.ReqID)
		}
	}
	seqs, toks := make([]*gpuSeq, p.NumSeqs()), make([][]int32, p.NumSeqs())
	for i := range seqs {
		id := p.ReqIDs[i]
		drafts := 0
		if p.NumDrafts != nil {
			drafts = int(p.NumDrafts[i])
		}
		if drafts > r.g.maxDrafts {
			return nil, nil, fmt.Errorf("%s on the GPU: %d draft tokens for request %d, room for %d (GPUOptions.Drafts)", Name, drafts, id, r.g.maxDrafts)
		}
		s, ok := r.seqs[id]
		if !ok {
			var err error
			if s, err = r.g.newSeq(); err != nil {
				return nil, nil, err
			}
			r.seqs[id] = s
		}
		if err := r.g.seqPages(p, i, s); err != nil {
			return nil, nil, err
		}
		s.Drafts = drafts
		seqs[i] = s
		toks[i], _ = p.Seq(i)
	}
	return seqs, toks, nil
}

// restoreDrafts puts back, for each sequence of plan p (the step just run) that was fed
// drafts, the KDA states after the last of its tokens the sampler accepted (accepted[i]
// tokens, as engine.StepResult.Accepted), where a draft was rejected.
func (r *GPURunner) restoreDrafts(p *engine.BatchPlan, accepted []int32) error {
	return r.dev.Do(func(c *cudart.Ctx) error {
		for i, id := range p.ReqIDs {
			s, ok := r.seqs[id]
			if !ok || s.Drafts == 0 {
				continue
			}
			if err := r.g.restoreDrafts(c, s, int(accepted[i])); err != nil {
				return err
			}
		}
		return nil
	})
}

// gpuDrafter is the runner's forward with the MTP layer on the device as cpurunner's
// Drafter (GPUOptions.Drafts > 0).
type gpuDrafter struct{ r *GPURunner }

func (d gpuDrafter) Forward(p *engine.BatchPlan, logits []float32) error {
	return d.r.forward(p, logits)
}
func (d gpuDrafter) MaxDrafts() int { return d.r.drafts }
func (d gpuDrafter) Draft(p *engine.BatchPlan, res *engine.StepResult) error {
	return d.r.mtpDraft(p, res)
}

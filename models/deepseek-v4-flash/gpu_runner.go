package deepseekv4flash

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
	"github.com/resin-llm/resin/models/deepseek-v4-flash/kernels"
)

// GPURunner serves the model to core/engine from one CUDA device: gpuModel's forward
// (doc.go's GPU kernels) with its steps sampled, and MTP drafts verified, on the device
// where the kernels cover every row (gpu_sample.go), else through core/cpurunner's engine
// wiring (host sampling on a copy of the device's logits). Each sequence's state lives
// in a device slot, and the pool NewPool
// binds (in device memory, the CPU runner's layout; gpu_pages.go) is kept equal to it,
// written through on the device after every step, so that a request the engine resumes
// from a prefix hit gets a slot filled back from its pages (gpu_cache.go). Unbound (no
// NewPool), a prefix hit is refused by name; so is a request continuing at another length
// than its slot holds.
type GPURunner struct {
	*cpurunner.Runner
	Model *Model
	dev   *cudart.Device
	kk    *cuda.Kernels
	blas  *cudart.Blas
	g     *gpuModel
	seqs  gpurunner.SeqSlots[*gpuSeq]
	pt    int
	kv    *devPages // the pool's pages; nil until NewPool
	arena *cudart.DeviceArena
	// With the MTP head (NewGPUMTPRunner): drafts per step and the step in flight (its
	// slots and pages) for draft.
	drafts   int
	stepSeqs []*gpuSeq
	mir      *mirrorStep
	// forceDraft, when set (tests), chooses each draft as Runner.forceDraft does.
	forceDraft func(promptLen, pos int, logits []float32) int32
	// The steps sampled on the device (gpu_sample.go): their result, the drafter their
	// drafts go to (gpuDrafter; a test's wrapper of it), and what sends a step to the host
	// instead (hostSampling: tests; capturing: CaptureLogits).
	res                     engine.StepResult
	drafter                 cpurunner.Drafter
	hostSampling, capturing bool
	// Stats count the steps by where they were sampled: on the device (no logits copied
	// back) or on the host, through cpurunner.
	Stats struct{ DeviceSampled, HostSampled int }
	// ownsDev: Close closes the device too (OpenGPU opened it).
	ownsDev bool
	closed  bool // Close ran
	// Under prefill CP (NewGPUCP): the steps run split.
	cpSplit int
}

var _ engine.Runner = (*GPURunner)(nil)

// NewGPURunner loads the kernels (through cache) and uploads m on dev with its GEMM
// weights in dt (cudart.F32 or cudart.BF16), for up to slots sequences at once and steps
// of up to maxTokens rows, maxRows of them sampled.
func NewGPURunner(m *Model, dev *cudart.Device, cache *cudart.KernelCache, dt cudart.DType, slots, maxTokens, maxRows int) (*GPURunner, error) {
	return newGPURunner(m, nil, dev, cache, dt, slots, maxTokens, maxRows, 0)
}

// NewGPUMTPRunner is NewGPURunner for a runner that decodes speculatively with the
// model's MTP head on the device, drafts tokens per sequence each step, as NewMTPRunner
// does on the CPU (same drafts, same verification, rejected drafts put back in the
// device slot and in the pool; gpu_mtp.go). Its pool has NewMTPRunner's layout; its
// logits rows must hold (1+drafts) per sequence.
func NewGPUMTPRunner(m *Model, dev *cudart.Device, cache *cudart.KernelCache, dt cudart.DType, slots, maxTokens, maxRows, drafts int) (*GPURunner, error) {
	if err := checkMTP(m, drafts); err != nil {
		return nil, err
	}
	return newGPURunner(m, nil, dev, cache, dt, slots, maxTokens, maxRows, drafts)
}

// checkMTP refuses speculative decoding with drafts per step where m cannot run it.
func checkMTP(m *Model, drafts int) error {
	c := m.Config
	if m.W.MTP == nil || c.NumNextNPredictLayers < 1 {
		return fmt.Errorf("%s: speculative decoding needs the MTP head (num_nextn_predict_layers %d, mtp.0.* loaded: %v)",
			Name, c.NumNextNPredictLayers, m.W.MTP != nil)
	}
	if drafts < 1 {
		return fmt.Errorf("%s: %d drafts per step", Name, drafts)
	}
	for i := range c.LayerTypes {
		if ratio := c.LayerRatio(i); ratio > 0 && ratio < 1+drafts {
			return fmt.Errorf("%s: %d drafts per step need compression ratios of at least %d, layer %d has %d", Name, drafts, 1+drafts, i, ratio)
		}
	}
	return nil
}

// newGPURunner is NewGPURunner (drafts > 0: NewGPUMTPRunner) with, when pk is not nil,
// the checkpoint's FP8 linears and MXFP4 experts uploaded as stored (newGPUModel).
func newGPURunner(m *Model, pk *gpuPacked, dev *cudart.Device, cache *cudart.KernelCache, dt cudart.DType, slots, maxTokens, maxRows, drafts int) (*GPURunner, error) {
	kk, err := cuda.Load(dev, cache)
	if err != nil {
		return nil, fmt.Errorf("%s on the GPU: %w", Name, err)
	}
	blas, err := cudart.NewBlas(dev)
	if err != nil {
		kk.Close()
		return nil, fmt.Errorf("%s on the GPU: %w", Name, err)
	}
	r := &GPURunner{Model: m, dev: dev, kk: kk, blas: blas, pt: PageTokens(m.Config, 0), drafts: drafts}
	r.seqs = gpurunner.SeqSlots[*gpuSeq]{Name: Name, New: func(c *cudart.Ctx) (*gpuSeq, error) { return r.g.newSeq(c) },
		Free: func(s *gpuSeq) { r.g.free(s) }, Len: func(s *gpuSeq) int { return s.Len }, Resume: r.resume, Drafts: drafts > 0}
	rows := maxTokens
	if drafts > 0 {
		rows += slots // the MTP head's rows: each sequence's fed tokens and one more
	}
	err = dev.Do(func(c *cudart.Ctx) error {
		vk, err := kernels.Load(c, cache, dev.Info.Arch())
		if err != nil {
			return err
		}
		r.g, err = newGPUModel(c, m, kk, vk, blas, dt, slots, rows, maxRows, drafts, dev, pk)
		return err
	})
	if err != nil {
		blas.Close()
		kk.Close()
		return nil, fmt.Errorf("%s on the GPU: %w", Name, err)
	}
	c := m.Config
	info := engine.RunnerInfo{Name: Name, VocabSize: c.VocabSize, MaxContext: m.MaxContext(), EOS: c.EOSTokenID,
		CacheGroups: layout(c, r.pt, drafts > 0).groups}
	if drafts > 0 {
		r.drafter = gpuDrafter{r}
		r.Runner = cpurunner.New(info, r.drafter)
	} else {
		r.Runner = cpurunner.New(info, cpurunner.ForwardFunc(r.forward))
	}
	return r, nil
}

// NewPool builds the pool of bytes bytes (0 = 256 MiB) the engine schedules with, in the
// device's memory, and binds the runner to it (an earlier pool's memory is freed): the
// device slots' state is written through to its pages, from which a prefix hit is
// restored. The engine's cache ops copy its pages on the device (DeviceArena.Copy).
func (r *GPURunner) NewPool(bytes int64) (*kvslab.Pool, error) {
	if bytes == 0 {
		bytes = 256 << 20
	}
	cfg := kvslab.Config{Groups: layout(r.Model.Config, r.pt, r.drafts > 0).groups}
	z, err := kvslab.Size(cfg, bytes, 1)
	if err != nil {
		return nil, fmt.Errorf("%s: cache pool: %w", Name, err)
	}
	arena, err := cudart.NewDeviceArena(r.dev, int64(z.Slabs)*z.SlabBytes)
	if err != nil {
		return nil, fmt.Errorf("%s: cache pool: %w", Name, err)
	}
	pool, err := kvslab.New(cfg, arena)
	var kv *devPages
	if err == nil {
		kv, err = newDevPages(r.Model.Config, pool, arena, r.drafts > 0)
	}
	if err != nil {
		arena.Close()
		return nil, fmt.Errorf("%s: cache pool: %w", Name, err)
	}
	if r.arena != nil {
		r.arena.Close()
	}
	r.kv, r.arena = kv, arena
	return pool, nil
}

// UseGraphs turns CUDA graphs on or off (gpu_graphs.go: decode steps one per batch
// bucket, prefill steps one per token bucket and sequence count; the MTP runner's steps
// stay eager; under DP-attention decode steps alone, by the gather exchange); a failed capture is noted on log (nil: dropped) and its shape runs
// eagerly. OpenGPU turns them on unless opts.Eager.
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

// StepCounts returns how many forward steps replayed a graph and how many ran eagerly.
func (r *GPURunner) StepCounts() (graph, eager int) { return r.g.Stats.Graph, r.g.Stats.Eager }

// resume takes a slot for plan sequence i, which resumes at its cached tokens, and fills
// it from the pool's pages.
func (r *GPURunner) resume(c *cudart.Ctx, p *engine.BatchPlan, i int) (*gpuSeq, error) {
	done := int(p.Computed[i])
	if r.kv == nil {
		return nil, fmt.Errorf("%s on the GPU: request %d resumes at %d cached tokens, but the runner has no pool to restore them from (NewPool)", Name, p.ReqIDs[i], done)
	}
	sp, err := r.kv.seq(p, i)
	if err != nil {
		return nil, err
	}
	s, err := r.g.newSeq(c)
	if err != nil {
		return nil, err
	}
	if err := r.g.restore(c, s, r.kv, &sp, done); err != nil {
		r.g.free(s)
		return nil, err
	}
	return s, nil
}

// Describe names the GEMM paths that run: the dense weights' element type and, for a
// runner OpenGPU opened on a checkpoint with FP8 or FP4 tensors, each packed type's path
// (gpurunner.Linears.Describe: "fp8-block128: ..." and "mxfp4: ...").
func (r *GPURunner) Describe() string { return r.g.lin.describe() }

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
	if r.arena != nil {
		if e := r.arena.Close(); err == nil {
			err = e
		}
		r.arena, r.kv = nil, nil
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
		seqs, toks, err := r.seqs.Bind(c, p)
		if err != nil {
			return err
		}
		want := p.LogitsIndices
		if want == nil {
			want = noRows // nil would ask for every row
		}
		var mir *mirrorStep
		if r.kv != nil {
			if mir, err = newMirrorStep(r.kv, p, r.g.s); err != nil {
				return err
			}
		}
		if r.drafts > 0 {
			r.stepSeqs, r.mir = seqs, mir
			if err := r.saveDrafts(c, p, seqs, mir); err != nil {
				return err
			}
		}
		if r.cpSplits(p) {
			got, err := r.g.runCP(c, seqs[0], toks[0], want, mir)
			if err != nil || got == 0 {
				return err
			}
			r.cpSplit++
			rows, err := r.g.downloadLogits(c, got)
			if err != nil {
				return err
			}
			copy(logits, rows[:len(want)*vocab])
			return nil
		}
		rows, err := r.g.forward(c, seqs, toks, want, mir)
		if err != nil {
			return err
		}
		copy(logits, rows[:len(want)*vocab])
		return nil
	})
}

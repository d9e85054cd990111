package glm5flash

import (
	"fmt"

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
// as deepseek-v4-flash's GPURunner. A first cut: each sequence's state lives in a device
// slot, not in the kvslab pool, so a request the engine resumes from a prefix hit, or
// continues at another length than the slot holds, is refused by name; drafts are
// refused too (no MTP on the device yet). The pool it is given only satisfies the
// engine's page accounting.
type GPURunner struct {
	*cpurunner.Runner
	Model      *TextModel
	MaxContext int
	dev        *cudart.Device
	kk         *cuda.Kernels
	blas       *cudart.Blas
	g          *gpuModel
	seqs       gpurunner.SeqSlots[*gpuSeq]
	pt         int
	// ownsDev: Close closes the device too (OpenGPU opened it).
	ownsDev bool
}

var (
	_ engine.Runner        = (*GPURunner)(nil)
	_ engine.PromptChecker = (*GPURunner)(nil)
)

// NewGPURunner loads the kernels (through cache) and uploads m on dev in fp32, for up to
// slots sequences of up to maxContext tokens (0: the CPU runner's default) at once and
// steps of up to maxTokens rows, maxRows of them sampled.
func NewGPURunner(m *TextModel, dev *cudart.Device, cache *cudart.KernelCache, slots, maxTokens, maxRows, maxContext int) (*GPURunner, error) {
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
		pt: TextPageTokens(m.Config, 0)}
	r.seqs = gpurunner.SeqSlots[*gpuSeq]{Name: Name, New: func(c *cudart.Ctx) (*gpuSeq, error) { return r.g.newSeq(c) },
		Free: func(s *gpuSeq) { r.g.free(s) }, Len: func(s *gpuSeq) int { return s.Len }}
	err = dev.Do(func(c *cudart.Ctx) error {
		ks, err := kernels.Load(c, cache, dev.Info.Arch())
		if err != nil {
			return err
		}
		// gpuDSA's workspace takes a step's rows as positions: at least maxTokens of them.
		r.g, err = newGPUModel(c, m, kk, ks, blas, slots, maxTokens, maxRows, max(maxContext, maxTokens), r.pt)
		return err
	})
	if err != nil {
		blas.Close()
		kk.Close()
		return nil, fmt.Errorf("%s on the GPU: %w", Name, err)
	}
	c := m.Config
	info := engine.RunnerInfo{Name: Name, VocabSize: c.VocabSize, MaxContext: maxContext, EOS: c.EOSTokenID,
		CacheGroups: TextCacheGroups(c, r.pt)}
	r.Runner = cpurunner.New(info, cpurunner.ForwardFunc(r.forward))
	return r, nil
}

// CheckPrompt refuses image and video placeholder tokens, as TextRunner.CheckPrompt.
func (r *GPURunner) CheckPrompt(prompt []int32) error {
	return r.Model.Config.RefuseVisionTokens(prompt)
}

// NewPool builds the host pool of bytes bytes (0 = 256 MiB) the engine schedules with.
func (r *GPURunner) NewPool(bytes int64) (*kvslab.Pool, error) {
	pool, err := engine.NewHostPool(TextCacheGroups(r.Model.Config, r.pt), bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: cache pool: %w", Name, err)
	}
	return pool, nil
}

// Close frees the device memory and the kernels (and closes the device OpenGPU opened);
// it must not run inside Device.Do.
func (r *GPURunner) Close() error {
	r.dev.Do(func(c *cudart.Ctx) error {
		r.g.close(c)
		return nil
	})
	r.blas.Close()
	err := r.kk.Close()
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
		rows, err := r.g.forward(c, seqs, toks, p.LogitsIndices)
		if err != nil {
			return err
		}
		copy(logits, rows[:len(p.LogitsIndices)*vocab])
		return nil
	})
}

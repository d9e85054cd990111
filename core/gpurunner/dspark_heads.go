package gpurunner

import (
	_ "embed"
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dspark"
	"github.com/resin-llm/resin/core/kernels/cuda"
)

// dsparkHeadsSource is the Markov head and confidence cut kernel (dspark_heads.cu).
//
//go:embed dspark_heads.cu
var dsparkHeadsSource string

const (
	dsparkMaxRank     = 1024 // dspark_heads.cu: DSPARK_MAX_RANK
	dsparkHeadThreads = 128  // a block per sequence
)

// dsparkHeads is dspark_heads.cu loaded on the runner's device.
type dsparkHeads struct {
	mod  *cudart.Module
	fn   cudart.Function
	args cudart.Args
}

// loadDSparkHeads compiles (through cache) and loads the kernel for the device of c.
func loadDSparkHeads(c *cudart.Ctx, cache *cudart.KernelCache) (*dsparkHeads, error) {
	const file = "dspark_heads.cu"
	img, err := cudart.CompileCached(cache, cuda.InlinePrelude(dsparkHeadsSource, file), file, c.Device().Info.Arch(), cuda.Options...)
	if err != nil {
		return nil, fmt.Errorf("gpurunner: %s: %w", file, err)
	}
	m, err := c.LoadModule(img)
	if err != nil {
		return nil, fmt.Errorf("gpurunner: %s: %w", file, err)
	}
	fn, err := c.Function(m, "resin_dspark_propose")
	if err != nil {
		c.UnloadModule(m)
		return nil, fmt.Errorf("gpurunner: %s: %w", file, err)
	}
	return &dsparkHeads{mod: m, fn: fn}, nil
}

// markovHeadKind is dspark_heads.cu's head code.
func markovHeadKind(c *dspark.Config) (int32, error) {
	if c.MarkovRank == 0 {
		return 0, nil
	}
	switch c.MarkovHead {
	case dspark.MarkovVanilla:
		return 1, nil
	case dspark.MarkovGated:
		return 2, nil
	case dspark.MarkovRNN:
		return 3, nil
	}
	return 0, fmt.Errorf("gpurunner: DSpark Markov head %q", c.MarkovHead)
}

// Propose draws the drafts of the blocks the last Blocks call returned (blks, in its
// order) on the device, with the Markov head and the confidence cut (dspark_heads.cu):
// what Drafter.Propose returns for each block under smps[i], but the Logits of the
// Proposals, which stay on the device (nil). Only the chains, the confidences, the cut and,
// for sampled sequences, the distributions of their drafts come back. It adds the Markov
// bias to the blocks' logits on the device, so it runs once per Blocks call.
func (g *DSparkBlocks) Propose(blks []*dspark.Block, smps []dspark.Sampling) ([]*dspark.Proposal, error) {
	c := g.d.Config
	B, V, S := c.BlockSize, c.Base.VocabSize, len(blks)
	if g.heads == nil {
		return nil, fmt.Errorf("gpurunner: DSpark heads on the device: not loaded")
	}
	if S == 0 || len(smps) != S || len(g.last) != S {
		return nil, fmt.Errorf("gpurunner: DSpark propose: %d blocks, %d samplings; the last Blocks call made %d", S, len(smps), len(g.last))
	}
	for i, b := range blks {
		if b != g.last[i] {
			return nil, fmt.Errorf("gpurunner: DSpark propose: block %d is not the last Blocks call's", i)
		}
	}
	g.last = nil // the bias is now in the logits
	R := S * B
	temps, thr, maxd, anchors := make([]float32, S), make([]float32, S), make([]int32, S), make([]int32, S)
	unif := make([]float64, R)
	for i, s := range smps {
		anchors[i] = blks[i].Anchor
		if s.Temperature >= dspark.GreedyBelow {
			if len(s.Uniforms) < B {
				return nil, fmt.Errorf("dspark: propose at temperature %g needs %d uniforms, got %d", s.Temperature, B, len(s.Uniforms))
			}
			temps[i] = s.Temperature
			copy(unif[i*B:(i+1)*B], s.Uniforms)
		}
		thr[i], maxd[i] = s.Threshold, int32(s.MaxDrafts)
		if !c.Confidence {
			thr[i] = 0
		}
	}
	head, err := markovHeadKind(c)
	if err != nil {
		return nil, err
	}
	chain, conf, nd := make([]int32, R), make([]float32, R), make([]int32, S)
	props := make([]*dspark.Proposal, S)
	r := g.r
	err = r.dev.Do(func(cx *cudart.Ctx) error {
		s := r.stream
		var p [bufCount]cudart.DevicePtr
		for _, b := range []struct {
			i int
			n int64
		}{{bufQOut, 4 * int64(R*V)}, {bufChain, 4 * int64(R)}, {bufConf, 4 * int64(R)}, {bufN, 4 * int64(S)},
			{bufTemps, 4 * int64(S)}, {bufThr, 4 * int64(S)}, {bufMaxD, 4 * int64(S)}, {bufUnif, 8 * int64(R)}, {bufAnchors, 4 * int64(S)}} {
			var err error
			if p[b.i], err = g.ensure(cx, b.i, b.n); err != nil {
				return err
			}
		}
		p[bufH], p[bufLogits] = g.bufs[bufH].Ptr, g.bufs[bufLogits].Ptr
		err := firstErr(cudart.UploadAsync(cx, p[bufTemps], temps, s), cudart.UploadAsync(cx, p[bufThr], thr, s),
			cudart.UploadAsync(cx, p[bufMaxD], maxd, s), cudart.UploadAsync(cx, p[bufUnif], unif, s),
			cudart.UploadAsync(cx, p[bufAnchors], anchors, s))
		if err != nil {
			return err
		}
		w := &g.w
		a := g.heads.args.Reset().Ptr(p[bufLogits]).Ptr(p[bufQOut]).Ptr(p[bufChain]).Ptr(p[bufConf]).Ptr(p[bufN]).
			Ptr(p[bufH]).Ptr(p[bufAnchors]).Ptr(p[bufTemps]).Ptr(p[bufUnif]).Ptr(p[bufThr]).Ptr(p[bufMaxD]).
			Ptr(w.table.Ptr).
			I32(int32(B)).I32(int32(V)).I32(int32(c.Base.HiddenSize)).I32(int32(c.MarkovRank)).I32(head).
			I32(boolI32(c.Confidence)).I32(boolI32(c.ConfidenceMarkov))
		if err := cx.Launch(g.heads.fn, cudart.D1(S), cudart.D1(dsparkHeadThreads), 0, s, a); err != nil {
			return fmt.Errorf("dspark_heads: %w", err)
		}
		err = firstErr(cudart.DownloadAsync(cx, chain, p[bufChain], s), cudart.DownloadAsync(cx, conf, p[bufConf], s),
			cudart.DownloadAsync(cx, nd, p[bufN], s), cx.Sync(s))
		if err != nil {
			return err
		}
		// The drafts' distributions: one-hot rows when greedy, the device's q when sampled.
		for i := range S {
			n := int(nd[i])
			if n < 0 || n > B {
				return fmt.Errorf("dspark_heads: %d drafts for a block of %d", n, B)
			}
			pr := &dspark.Proposal{Chain: chain[i*B : (i+1)*B : (i+1)*B], Drafts: chain[i*B : i*B+n : i*B+n], Q: make([]float32, n*V)}
			for j, d := range pr.Chain {
				if d < 0 || int(d) >= V {
					return fmt.Errorf("dspark_heads: slot %d of block %d drew token %d outside the vocabulary of %d", j, i, d, V)
				}
			}
			if c.Confidence {
				pr.Confidence = conf[i*B : (i+1)*B : (i+1)*B]
			}
			if temps[i] == 0 {
				for j, d := range pr.Drafts {
					pr.Q[j*V+int(d)] = 1
				}
			} else if n > 0 {
				if err := cudart.DownloadAsync(cx, pr.Q, p[bufQOut].Add(4*int64(i*B*V)), s); err != nil {
					return err
				}
			}
			props[i] = pr
		}
		return cx.Sync(s)
	})
	if err != nil {
		return nil, fmt.Errorf("gpurunner: DSpark propose: %w", err)
	}
	return props, nil
}

func boolI32(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

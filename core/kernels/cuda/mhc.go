package cuda

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
)

// MaxHyperStreams is the most mHC streams per token the mHC kernels take (mhc.cu:
// RESIN_MHC_MAX_HC).
const MaxHyperStreams = 16

// HyperPre is one call of resin_mhc_pre_f32 (mhc.cu): per token, the mixing weights of one
// mHC from the projection of its streams, and the streams collapsed into the block input
// (ref.HyperConnWeights then ref.HyperCollapse, with ref.RMSNormUnweighted's 1/rms applied
// to the projection). Head is the final collapse (hc_head): Mix holds hc values a token
// and only Collapsed is written. Pointers are device addresses of float32.
type HyperPre struct {
	Post      cudart.DevicePtr // [Rows, HC]; unused with Head
	Comb      cudart.DevicePtr // [Rows, HC, HC]; unused with Head
	Collapsed cudart.DevicePtr // [Rows, Dim]
	Streams   cudart.DevicePtr // [Rows, HC, Dim]
	Mix       cudart.DevicePtr // [Rows, (2+HC)·HC] (HC with Head): fn·streams, the raw streams' GEMM
	Base      cudart.DevicePtr // [(2+HC)·HC] (HC with Head)
	Scale     cudart.DevicePtr // [3] (1 with Head)
	Rows, HC  int
	Dim       int
	Iters     int     // Sinkhorn iterations (hc_sinkhorn_iters)
	Eps       float32 // hc_eps
	NormEps   float32 // the unweighted RMSNorm's eps
	Head      bool
}

func (p *HyperPre) pack(spec *launchSpec) error {
	if err := positive("HyperPre", p.Rows, p.HC, p.Dim); err != nil {
		return err
	}
	if p.HC > MaxHyperStreams {
		return fmt.Errorf("cuda.HyperPre: %d streams exceed %d", p.HC, MaxHyperStreams)
	}
	if p.Iters < 0 {
		return fmt.Errorf("cuda.HyperPre: negative Sinkhorn iterations %d", p.Iters)
	}
	spec.kernel = kHyperPre
	spec.grid, spec.block, spec.shared = cudart.D1(p.Rows), cudart.D1(rowThreads), 0
	spec.args.reset().ptr(p.Post).ptr(p.Comb).ptr(p.Collapsed).ptr(p.Streams).ptr(p.Mix).ptr(p.Base).ptr(p.Scale).
		i32(p.Rows).i32(p.HC).i32(p.Dim).i32(p.Iters).f32(p.Eps).f32(p.NormEps).flag(p.Head)
	return nil
}

// HyperPre launches one mHC's weights and collapse.
func (k *Kernels) HyperPre(c *cudart.Ctx, s *cudart.Stream, p HyperPre) error {
	spec := &k.specs[kHyperPre]
	if err := p.pack(spec); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}

// HyperPost is one call of resin_mhc_post_f32 (mhc.cu), ref.HyperExpand for every token:
// the streams refreshed from the block output with post and comb. Out must not alias
// Streams.
type HyperPost struct {
	Out      cudart.DevicePtr // [Rows, HC, Dim]
	Streams  cudart.DevicePtr // [Rows, HC, Dim]
	Block    cudart.DevicePtr // [Rows, Dim]
	Post     cudart.DevicePtr // [Rows, HC]
	Comb     cudart.DevicePtr // [Rows, HC, HC]
	Rows, HC int
	Dim      int
}

func (p *HyperPost) pack(spec *launchSpec) error {
	if err := positive("HyperPost", p.Rows, p.HC, p.Dim, p.Rows*p.HC*p.Dim); err != nil {
		return err
	}
	if p.Out == p.Streams {
		return fmt.Errorf("cuda.HyperPost: the output aliases the streams")
	}
	spec.kernel = kHyperPost
	spec.grid, spec.block = elementwise(p.Rows * p.HC * p.Dim)
	spec.shared = 0
	spec.args.reset().ptr(p.Out).ptr(p.Streams).ptr(p.Block).ptr(p.Post).ptr(p.Comb).i32(p.Rows).i32(p.HC).i32(p.Dim)
	return nil
}

// HyperPost launches one mHC's stream refresh.
func (k *Kernels) HyperPost(c *cudart.Ctx, s *cudart.Stream, p HyperPost) error {
	spec := &k.specs[kHyperPost]
	if err := p.pack(spec); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}

package glm5flash

import (
	"errors"
	"fmt"
	"slices"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/weights"
)

// FP8 block-scaled linears (GPUOptions.Checkpoint): where the checkpoint stores a linear
// as F8_E4M3 with 128×128 weight_scale_inv blocks (GLM-5.3-Flash's FP8 checkpoint), the GPU
// runner uploads it as stored through core/gpurunner's Linears (PackedReader.ReadFP8 →
// UploadFP8: the activation quantised to e4m3 per row and 128 columns, cuBLASLt's
// block-scaled FP8 GEMM on sm_90 with cuBLASLt 12.9+, else the fallback kernel), the path
// models/deepseek-v4-flash runs. Which linears: the MLA projections q_a, q_b, kv_a and o
// and the indexer's wq_b and wk (gpuDSA), the dense MLPs and shared experts (gate and up
// stacked when the gate fills whole 128-row blocks, else both dequantised), each routed
// expert's gate_up and down (a fused bank or per-expert tensors, laid out as one bank of
// every expert and run grouped over the masked layout by Linears.Experts: one activation
// quantisation and one launch a bank, the layout's counts read on the device, so graphs
// capture it), lm_head, and the same linears of the MTP layer (with its eh_proj and own
// head when FP8). The rest is uploaded from the dequantised float32 values (Model's):
// kv_b (absorbed into the sparse MLA kernel), weights_proj (scaled by N^-½ in its GEMM),
// the KPool gate, the router and the mHC mixes; the KDA projections follow
// GPUOptions.KDAWeights (OpenGPU sets bf16 when the checkpoint ships them so). No float32
// copy of an FP8 linear goes to the device.

// gpuFP8 reads a checkpoint's FP8 linears as stored.
type gpuFP8 struct {
	ck    *weights.Checkpoint
	r     *gpurunner.PackedReader
	reads int // the FP8 tensors read (uploaded)
}

// openGPUFP8 opens dir's checkpoint for its FP8 linears: nil (and no error) when dir is
// "", the config has no fine-grained FP8 quantization_config, or its blocks are not the
// 128×128 the GPU's FP8 linears take (then every weight is uploaded dequantised; why says
// so for the startup line).
func openGPUFP8(dir string, q *weights.Quant) (p *gpuFP8, why string, err error) {
	switch {
	case dir == "":
		return nil, "", nil
	case q == nil:
		return nil, "the checkpoint has no quantization_config", nil
	case q.Method == "modelopt":
		return nil, "ModelOpt checkpoints are dequantised (fine-grained FP8 only)", nil
	case q.BlockSize != [2]int{128, 128}:
		return nil, fmt.Sprintf("FP8 blocks %v are dequantised (the GPU's FP8 linears take 128×128)", q.BlockSize), nil
	}
	ck, err := weights.Open(dir)
	if errors.Is(err, weights.ErrNotFound) {
		return nil, "no safetensors", nil
	}
	if err != nil {
		return nil, "", err
	}
	r, err := gpurunner.NewPackedReader(ck, q)
	if err != nil {
		ck.Close()
		return nil, "", err
	}
	return &gpuFP8{ck: ck, r: r}, "", nil
}

func (p *gpuFP8) close() {
	if p != nil {
		p.r.Close()
		p.ck.Close()
	}
}

// stored reports whether tensor name is stored as F8_E4M3.
func (p *gpuFP8) stored(name string) bool {
	if p == nil {
		return false
	}
	dt, ok := p.r.Stored(name)
	return ok && dt == weights.F8E4M3
}

// read reads name [out, in] as stored; ok is false when it is not FP8.
func (p *gpuFP8) read(name string, out, in int) (_ gpurunner.PackedFP8, ok bool, err error) {
	if !p.stored(name) {
		return gpurunner.PackedFP8{}, false, nil
	}
	w, err := p.r.ReadFP8(name, out, in)
	p.reads++
	return w, err == nil, err
}

// fp8Linear uploads w as one of the model's linears (freed by close).
func (g *gpuModel) fp8Linear(c *cudart.Ctx, w gpurunner.PackedFP8) (*gpurunner.Linear, error) {
	l, err := g.lin.UploadFP8(c, w)
	if err != nil {
		return nil, fmt.Errorf("gpu: fp8 weights: %w", err)
	}
	g.linears = append(g.linears, l)
	g.fp8Count += l.Experts // a bank counts its experts
	return l, nil
}

// fp8Tensor uploads tensor name [out, in] when the checkpoint stores it FP8, else returns nil.
func (g *gpuModel) fp8Tensor(c *cudart.Ctx, pk *gpuFP8, name string, out, in int) (*gpurunner.Linear, error) {
	w, ok, err := pk.read(name, out, in)
	if err != nil || !ok {
		return nil, err
	}
	return g.fp8Linear(c, w)
}

// fp8MLP uploads the clamped SwiGLU MLP under prefix ("…mlp." or "…shared_experts.") in
// FP8: gate and up stacked (nil when either is not FP8 or the gate ends mid-block), and
// down (nil when not FP8).
func (g *gpuModel) fp8MLP(c *cudart.Ctx, pk *gpuFP8, prefix string, d, width int) (gateUp, down *gpurunner.Linear, err error) {
	gate, okG, err := pk.read(prefix+"gate_proj.weight", width, d)
	if err != nil {
		return nil, nil, err
	}
	up, okU, err := pk.read(prefix+"up_proj.weight", width, d)
	if err != nil {
		return nil, nil, err
	}
	if okG && okU && width%128 == 0 {
		s, err := gpurunner.StackFP8(gate, up)
		if err != nil {
			return nil, nil, err
		}
		if gateUp, err = g.fp8Linear(c, s); err != nil {
			return nil, nil, err
		}
	}
	down, err = g.fp8Tensor(c, pk, prefix+"down_proj.weight", d, width)
	return gateUp, down, err
}

// fp8Experts uploads e's routed experts under prefix ("…mlp.") as the checkpoint stores
// them, when every expert of a part is FP8: gate_up [E, 2F, D] and down [E, D, F] from the
// fused banks (experts.gate_up_proj, experts.down_proj) or the per-expert tensors (each
// expert's gate and up stacked by gpurunner.StackFP8, which needs the gate to fill whole
// 128-row blocks, then the experts laid end to end as a bank). Each part goes up as one
// bank run grouped over the masked layout (e.gateUpBank, e.downBank), or with perExpert
// one linear an expert (e.gateUpL, e.downL); a part not all FP8 stays unset (nothing of
// it uploaded) and runs from the dequantised values.
func (g *gpuModel) fp8Experts(c *cudart.Ctx, pk *gpuFP8, e *gpuMoE, prefix string, perExpert bool) error {
	gateUp, down, err := readFP8Experts(pk, g.m.Config, prefix)
	if err != nil {
		return err
	}
	put := func(b *gpurunner.PackedFP8, bank **gpurunner.Linear, ls *[]*gpurunner.Linear) error {
		if b == nil {
			return nil
		}
		if !perExpert {
			l, err := g.fp8Linear(c, *b)
			*bank, g.banks = l, g.banks || err == nil
			return err
		}
		for x := range b.Experts {
			w, err := b.Expert(x)
			if err != nil {
				return err
			}
			l, err := g.fp8Linear(c, w)
			if err != nil {
				return err
			}
			*ls = append(*ls, l)
		}
		return nil
	}
	if err := put(gateUp, &e.gateUpBank, &e.gateUpL); err != nil {
		return err
	}
	return put(down, &e.downBank, &e.downL)
}

// readFP8Experts reads the routed experts under prefix as banks of cfg's experts (see
// fp8Experts); a part is nil when not every expert of it is stored FP8 (or a gate ends
// mid-block).
func readFP8Experts(pk *gpuFP8, cfg *TextConfig, prefix string) (gateUp, down *gpurunner.PackedFP8, err error) {
	E, D, F := cfg.NRoutedExperts, cfg.HiddenSize, cfg.MoEIntermediateSize
	if _, ok := pk.r.Stored(prefix + "experts.gate_up_proj"); ok {
		bank := func(name string, out, in int) (*gpurunner.PackedFP8, error) {
			if !pk.stored(name) {
				return nil, nil
			}
			b, err := pk.r.ReadFP8Bank(name, E, out, in)
			pk.reads++
			return &b, err
		}
		if gateUp, err = bank(prefix+"experts.gate_up_proj", 2*F, D); err == nil {
			down, err = bank(prefix+"experts.down_proj", D, F)
		}
		return gateUp, down, err
	}
	var gus, dns []gpurunner.PackedFP8
	for x := range E {
		ep := fmt.Sprintf("%sexperts.%d.", prefix, x)
		gate, okG, err := pk.read(ep+"gate_proj.weight", F, D)
		if err != nil {
			return nil, nil, err
		}
		up, okU, err := pk.read(ep+"up_proj.weight", F, D)
		if err != nil {
			return nil, nil, err
		}
		if okG && okU && F%128 == 0 && len(gus) == x {
			s, err := gpurunner.StackFP8(gate, up)
			if err != nil {
				return nil, nil, err
			}
			gus = append(gus, s)
		}
		dn, ok, err := pk.read(ep+"down_proj.weight", D, F)
		if err != nil {
			return nil, nil, err
		}
		if ok && len(dns) == x {
			dns = append(dns, dn)
		}
	}
	if len(gus) == E {
		if gateUp, err = bankFP8(gus); err != nil {
			return nil, nil, err
		}
	}
	if len(dns) == E {
		down, err = bankFP8(dns)
	}
	return gateUp, down, err
}

// bankFP8 lays FP8 weights of one shape end to end as a bank of len(ws) experts (the
// fused experts tensor's layout: PackedFP8.Expert takes them apart again).
func bankFP8(ws []gpurunner.PackedFP8) (*gpurunner.PackedFP8, error) {
	b := &gpurunner.PackedFP8{Out: ws[0].Out, In: ws[0].In, Experts: len(ws)}
	for i, w := range ws {
		if err := w.Check(); err != nil {
			return nil, fmt.Errorf("bank expert %d: %w", i, err)
		}
		if w.Out != b.Out || w.In != b.In || w.Experts > 1 {
			return nil, fmt.Errorf("bank expert %d is %d × [%d, %d], want one [%d, %d]", i, max(w.Experts, 1), w.Out, w.In, b.Out, b.In)
		}
		b.W = append(b.W, w.W...)
		b.Scale = append(b.Scale, w.Scale...)
	}
	return b, nil
}

// fp8Stored counts the checkpoint's F8_E4M3 tensors (the MTP layer's included).
func (p *gpuFP8) fp8Stored() int {
	n := 0
	for _, name := range p.ck.Names() {
		if p.stored(name) {
			n++
		}
	}
	return n
}

// describeFP8 is the startup line's FP8 part: how many linears run packed and on which
// path, and how many FP8 tensors of the checkpoint were dequantised instead.
func (g *gpuModel) describeFP8() string {
	if g.fp8Why != "" {
		return "fp8: none packed (" + g.fp8Why + ")"
	}
	if g.fp8Stored == 0 {
		return ""
	}
	var bytes, f32 int64
	for _, l := range g.linears {
		if l.DType == gpurunner.LinearFP8Block {
			bytes += l.Bytes()
			f32 += 4 * int64(l.Out) * int64(l.In) * int64(l.Experts)
		}
	}
	path, why := g.lin.FP8Path()
	return fmt.Sprintf("fp8-block128: %d linears packed, %.1f MiB on the device (%.1f MiB in float32), %v (%s); %d of the checkpoint's %d FP8 tensors dequantised (kv_b, weights_proj, unstackable gate/up; the MTP layer's without drafts)",
		g.fp8Count, float64(bytes)/(1<<20), float64(f32)/(1<<20), path, why, g.fp8Stored-g.fp8Read, g.fp8Stored)
}

// shippedKDAType is the element type in which dir's quantized checkpoint stores the KDA
// projections (the first linear-attention layer's q_proj): cudart.BF16 when it is BF16 in
// an FP8 checkpoint (as GLM-5.3-Flash's ships them), else cudart.F32 (every other case
// keeps the float32 upload).
func shippedKDAType(dir string, c *TextConfig) cudart.DType {
	if c.Quant == nil {
		return cudart.F32
	}
	li := slices.Index(c.LayerTypes, LinearAttention)
	if li < 0 {
		return cudart.F32
	}
	ck, err := weights.Open(dir)
	if err != nil {
		return cudart.F32
	}
	defer ck.Close()
	if info, ok := ck.Info(fmt.Sprintf("%slayers.%d.self_attn.q_proj.weight", TextPrefix, li)); ok && info.DType == weights.BF16 {
		return cudart.BF16
	}
	return cudart.F32
}

// Describe names the GEMM paths the runner's weights take, for the startup line: the KDA
// projections', the MLPs', experts' and lm_head's element type, and the FP8 linears (how
// many, their device bytes against float32, the FP8 path and why, the FP8 tensors
// dequantised instead).
func (r *GPURunner) Describe() string {
	g := r.g
	s := fmt.Sprintf("KDA projections %v; MLPs, experts and lm_head %v (the MTP layer's eh_proj, MoE and head too); MLA, router and mHC f32", g.kda.wt, r.opts.Weights)
	if f := g.describeFP8(); f != "" {
		s += "; " + f
	}
	return s
}

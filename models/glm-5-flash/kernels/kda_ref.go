package kernels

import (
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/kernels/ref"
)

// The references of kda_prep.cu's kernels: the steps of the model's KDA layer
// (forward.go's kda) one at a time, on core/kernels/ref. The recurrence's are
// ref.KDAStep and ref.KDAChunked themselves.

// CausalConvSiLURef is glm5flash_causal_conv_silu's reference: ref.CausalConvStep, then
// ref.SiLU on every output.
//
//	x, out: [tokens, channels]   w: [channels, kernel]   state: [channels, kernel−1]
func CausalConvSiLURef(out, state, x, w []float32, tokens, channels, kernel int) error {
	if err := ref.CausalConvStep(out, state, x, w, tokens, channels, kernel); err != nil {
		return fmt.Errorf("causal_conv_silu reference: %w", err)
	}
	for i := range out[:tokens*channels] {
		out[i] = ref.SiLU(out[i])
	}
	return nil
}

// L2NormRef is glm5flash_l2norm's reference: each row of dim becomes x/√(Σx²+1e-6)·mul.
func L2NormRef(x []float32, rows, dim int, mul float32) error {
	if rows <= 0 || dim <= 0 || len(x) < rows*dim {
		return fmt.Errorf("l2norm reference: %d rows of %d in %d floats", rows, dim, len(x))
	}
	for o := 0; o < rows*dim; o += dim {
		var s float32
		for _, e := range x[o : o+dim] {
			s += e * e
		}
		n := float32(math.Sqrt(float64(s) + 1e-6))
		for i := range dim {
			x[o+i] = x[o+i] / n * mul
		}
	}
	return nil
}

// KDAGateRef is glm5flash_kda_gate's reference: g [tokens, heads·dh] in place, with
// f = g + dtBias and a = exp(aLog[h]), lowerBound·sigmoid(a·f) when lowerBound is set,
// else −a·softplus(f).
func KDAGateRef(g, aLog, dtBias []float32, tokens, heads, dh int, lowerBound *float64) error {
	L := heads * dh
	if tokens <= 0 || heads <= 0 || dh <= 0 || len(g) < tokens*L || len(aLog) < heads || len(dtBias) < L {
		return fmt.Errorf("kda_gate reference: %d tokens × %d heads × %d with g %d, A_log %d, dt_bias %d", tokens, heads, dh, len(g), len(aLog), len(dtBias))
	}
	for t := range tokens {
		for h := range heads {
			a := math.Exp(float64(aLog[h]))
			for j := range dh {
				i := t*L + h*dh + j
				f := float64(g[i] + dtBias[h*dh+j])
				if lowerBound != nil {
					g[i] = float32(*lowerBound / (1 + math.Exp(-a*f)))
					continue
				}
				sp := f
				if f <= 20 {
					sp = math.Log(1 + math.Exp(f))
				}
				g[i] = float32(-a * sp)
			}
		}
	}
	return nil
}

// SigmoidRef is glm5flash_sigmoid's reference, in place.
func SigmoidRef(x []float32) {
	for i, v := range x {
		x[i] = float32(1 / (1 + math.Exp(-float64(v))))
	}
}

// GatedRMSNormRef is glm5flash_gated_rmsnorm's reference: out = RMSNorm(x)·w·sigmoid(gate).
//
//	x, gate, out: [rows, dim]   w: [dim]
func GatedRMSNormRef(out, x, gate, w []float32, rows, dim int, eps float32) error {
	if len(gate) < rows*dim {
		return fmt.Errorf("gated_rmsnorm reference: gate has %d floats, want %d", len(gate), rows*dim)
	}
	if err := ref.RMSNorm(out, x, w, rows, dim, eps); err != nil {
		return fmt.Errorf("gated_rmsnorm reference: %w", err)
	}
	for i := range out[:rows*dim] {
		out[i] *= float32(1 / (1 + math.Exp(-float64(gate[i]))))
	}
	return nil
}

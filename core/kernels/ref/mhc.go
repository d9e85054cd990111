package ref

import "math"

// axpy adds a·x to y, each product rounded before its sum on amd64 (gonum's assembly does
// not fuse them; its pure-Go loop elsewhere may). gonum skips the work when a is 0; then
// the loop runs, so that 0·Inf still gives NaN.
func axpy(a float32, x, y []float32) {
	if a == 0 {
		for i, v := range x {
			y[i] += float32(a * v)
		}
		return
	}
	vek.Saxpy(len(x), a, x, 1, y, 1)
}

// Manifold-constrained hyper-connections (mHC; DeepSeek-V4, GLM-5-Next): the residual is
// kept as hc parallel streams per token, collapsed into one block input by the "pre"
// weights and refreshed from the block output by the "post" weights and a doubly
// stochastic "comb" mixing matrix (Sinkhorn-Knopp).

// RMSNormUnweighted normalises each row by its root mean square, without a weight:
//
//	x: [rows, dim]   out: [rows, dim]
//	out[r, i] = x[r, i] / sqrt(mean_j(x[r, j]²) + eps)
//
// out may alias x. The sum of squares is accumulated in float64.
func RMSNormUnweighted(out, x []float32, rows, dim int, eps float32) error {
	return rmsNorm("RMSNormUnweighted", out, x, nil, rows, dim, eps)
}

// HyperConnWeights turns one token's mHC projection into its mixing weights.
//
//	mix: [(2+hc)·hc] = [pre | post | comb (hc×hc, row-major)], the projection fn·RMSNorm(streams)
//	base: [(2+hc)·hc]   scale: [3]
//	pre:  [hc]     pre[i]  = sigmoid(mix_pre[i]·scale[0] + base_pre[i]) + eps
//	post: [hc]     post[i] = 2·sigmoid(mix_post[i]·scale[1] + base_post[i])
//	comb: [hc, hc] softmax over each row of mix_comb·scale[2] + base_comb, + eps, then
//	               columns normalised, then iters−1 times rows and columns normalised
//	               (each divides by sum + eps)
func HyperConnWeights(pre, post, comb, mix, base, scale []float32, hc, iters int, eps float32) error {
	n := (2 + hc) * hc
	for _, a := range []struct {
		name string
		s    []float32
		want int
	}{{"mix", mix, n}, {"base", base, n}, {"scale", scale, 3}, {"pre", pre, hc}, {"post", post, hc}, {"comb", comb, hc * hc}} {
		if err := checkLen("HyperConnWeights", a.name, len(a.s), a.want); err != nil {
			return err
		}
	}
	sig := func(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }
	for i := range hc {
		pre[i] = sig(mix[i]*scale[0]+base[i]) + eps
		post[i] = 2 * sig(mix[hc+i]*scale[1]+base[hc+i])
	}
	for i := range hc * hc {
		comb[i] = mix[2*hc+i]*scale[2] + base[2*hc+i]
	}
	softmaxRows32(comb, hc, hc)
	for i := range comb[:hc*hc] {
		comb[i] += eps
	}
	normCols(comb, hc, eps)
	for range iters - 1 {
		normRows(comb, hc, eps)
		normCols(comb, hc, eps)
	}
	return nil
}

// softmaxRows32 is a row softmax computed in float32, as torch does for float32 input.
func softmaxRows32(x []float32, rows, n int) {
	for r := range rows {
		row := x[r*n : (r+1)*n]
		mx := row[0]
		for _, v := range row[1:] {
			mx = max(mx, v)
		}
		var sum float32
		for i, v := range row {
			row[i] = float32(math.Exp(float64(v - mx)))
			sum += row[i]
		}
		for i := range row {
			row[i] /= sum
		}
	}
}

func normRows(m []float32, n int, eps float32) {
	for i := range n {
		var s float32
		for j := range n {
			s += m[i*n+j]
		}
		for j := range n {
			m[i*n+j] /= s + eps
		}
	}
}

func normCols(m []float32, n int, eps float32) {
	for j := range n {
		var s float32
		for i := range n {
			s += m[i*n+j]
		}
		for i := range n {
			m[i*n+j] /= s + eps
		}
	}
}

// HyperCollapse sums one token's streams weighted by pre.
//
//	streams: [hc, dim]   pre: [hc]   out: [dim]   out[d] = Σ_i pre[i]·streams[i, d]
func HyperCollapse(out, streams, pre []float32, hc, dim int) error {
	if err := checkLen("HyperCollapse", "streams", len(streams), hc*dim); err != nil {
		return err
	}
	if err := checkLen("HyperCollapse", "out", len(out), dim); err != nil {
		return err
	}
	if err := checkLen("HyperCollapse", "pre", len(pre), hc); err != nil {
		return err
	}
	clear(out[:dim])
	for i := range hc {
		axpy(pre[i], streams[i*dim:(i+1)*dim], out[:dim])
	}
	return nil
}

// HyperExpand refreshes one token's streams from a block output:
//
//	streams: [hc, dim]   block: [dim]   post: [hc]   comb: [hc, hc]   out: [hc, dim]
//	out[k, d] = post[k]·block[d] + Σ_j comb[j, k]·streams[j, d]      (combᵀ·streams)
//
// out must not alias streams.
func HyperExpand(out, streams, block, post, comb []float32, hc, dim int) error {
	if err := checkLen("HyperExpand", "streams", len(streams), hc*dim); err != nil {
		return err
	}
	if err := checkLen("HyperExpand", "out", len(out), hc*dim); err != nil {
		return err
	}
	if err := checkLen("HyperExpand", "block", len(block), dim); err != nil {
		return err
	}
	if err := checkLen("HyperExpand", "post", len(post), hc); err != nil {
		return err
	}
	if err := checkLen("HyperExpand", "comb", len(comb), hc*hc); err != nil {
		return err
	}
	for k := range hc {
		o := out[k*dim : (k+1)*dim]
		for d := range dim {
			o[d] = post[k] * block[d]
		}
		for j := range hc {
			axpy(comb[j*hc+k], streams[j*dim:(j+1)*dim], o)
		}
	}
	return nil
}

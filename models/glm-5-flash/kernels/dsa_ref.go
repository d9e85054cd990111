package kernels

import (
	"fmt"
	"math"
	"slices"
)

// The references of dsa.cu's kernels: the DSA indexer and the absorbed sparse MLA of the
// model's MLA layers (forward.go's index and mla), one step each, over contiguous
// per-position buffers.

// IndexerKeysRef is glm5flash_indexer_keys's reference: each row of k [rows, dim] in place
// becomes LayerNorm(row)·w + b (eps 1e-6, mean and variance in float64).
func IndexerKeysRef(k, w, b []float32, rows, dim int) error {
	if rows <= 0 || dim <= 0 || len(k) < rows*dim || len(w) < dim || len(b) < dim {
		return fmt.Errorf("indexer_keys reference: %d rows of %d with k %d, w %d, b %d", rows, dim, len(k), len(w), len(b))
	}
	for t := range rows {
		r := k[t*dim : (t+1)*dim]
		var mean, vr float64
		for _, e := range r {
			mean += float64(e)
		}
		mean /= float64(dim)
		for _, e := range r {
			vr += (float64(e) - mean) * (float64(e) - mean)
		}
		vr /= float64(dim)
		inv := 1 / math.Sqrt(vr+1e-6)
		for j := range r {
			r[j] = float32((float64(r[j])-mean)*inv)*w[j] + b[j]
		}
	}
	return nil
}

// KPoolCompressRef is glm5flash_kpool_compress's reference: for pools j in [j0, j1),
// pools[j, c] = Σ_s softmax_s(gates[jP+s, c] + ape[s, c])·keys[jP+s, c] (in float64).
//
//	keys, gates: [positions, dim]   ape: [pool, dim]   pools: [≥ j1, dim]
func KPoolCompressRef(pools, keys, gates, ape []float32, j0, j1, pool, dim int) error {
	if j0 < 0 || j1 < j0 || pool <= 0 || dim <= 0 || len(keys) < j1*pool*dim || len(gates) < j1*pool*dim ||
		len(ape) < pool*dim || len(pools) < j1*dim {
		return fmt.Errorf("kpool_compress reference: pools [%d, %d) of %d × %d with short buffers", j0, j1, pool, dim)
	}
	for j := j0; j < j1; j++ {
		for ch := range dim {
			mx := math.Inf(-1)
			for s := range pool {
				mx = max(mx, float64(gates[(j*pool+s)*dim+ch]+ape[s*dim+ch]))
			}
			var sum, acc float64
			for s := range pool {
				e := math.Exp(float64(gates[(j*pool+s)*dim+ch]+ape[s*dim+ch]) - mx)
				sum += e
				acc += e * float64(keys[(j*pool+s)*dim+ch])
			}
			pools[j*dim+ch] = float32(acc / sum)
		}
	}
	return nil
}

// IndexerScoresRef is glm5flash_indexer_scores's reference: for query t at position
// pos0+t and each complete pool j it sees (j < (pos0+t+1)/pool),
// score[t·stride + j] = Σ_h hw[t, h]·max(q[t, h]·pools[j]·dscale, 0).
//
//	q: [tokens, heads, dim]   hw: [tokens, heads]   pools: [pools, dim]
func IndexerScoresRef(score, q, hw, pools []float32, tokens, pos0, pool, heads, dim, stride int, dscale float32) error {
	last := (pos0 + tokens) / pool
	if tokens <= 0 || pos0 < 0 || pool <= 0 || heads <= 0 || dim <= 0 || stride < last ||
		len(score) < tokens*stride || len(q) < tokens*heads*dim || len(hw) < tokens*heads || len(pools) < last*dim {
		return fmt.Errorf("indexer_scores reference: %d tokens at %d, pool %d, %d heads of %d, stride %d: bad shape", tokens, pos0, pool, heads, dim, stride)
	}
	for t := range tokens {
		for j := range (pos0 + t + 1) / pool {
			pk := pools[j*dim : (j+1)*dim]
			var score32 float32
			for h := range heads {
				qh := q[(t*heads+h)*dim : (t*heads+h+1)*dim]
				var s float32
				for d := range dim {
					s += qh[d] * pk[d]
				}
				score32 += hw[t*heads+h] * max(s*dscale, 0)
			}
			score[t*stride+j] = score32
		}
	}
	return nil
}

// PoolTopKRef is glm5flash_pool_topk's reference: per query t at position pos0+t, the
// tokens of its top k visible complete pools by score (a stable descending sort, so ties
// go to the lower pool) in ascending order, then with tail the visible tokens of the
// incomplete pool.
func PoolTopKRef(score []float32, tokens, pos0, pool, k int, tail bool, stride int) ([][]int32, error) {
	if tokens <= 0 || pos0 < 0 || pool <= 0 || k <= 0 || stride < (pos0+tokens)/pool || len(score) < tokens*stride {
		return nil, fmt.Errorf("pool_topk reference: %d tokens at %d, pool %d, k %d, stride %d: bad shape", tokens, pos0, pool, k, stride)
	}
	sel := make([][]int32, tokens)
	for t := range tokens {
		pos := pos0 + t
		visible := (pos + 1) / pool
		js := make([]int, visible)
		for j := range js {
			js[j] = j
		}
		sc := score[t*stride:]
		slices.SortStableFunc(js, func(a, b int) int {
			switch {
			case sc[a] > sc[b]:
				return -1
			case sc[a] < sc[b]:
				return 1
			}
			return 0
		})
		js = js[:min(k, len(js))]
		slices.Sort(js)
		toks := []int32{}
		for _, j := range js {
			for s := range pool {
				toks = append(toks, int32(j*pool+s))
			}
		}
		if tail {
			for p := visible * pool; p <= pos; p++ {
				toks = append(toks, int32(p))
			}
		}
		sel[t] = toks
	}
	return sel, nil
}

// SparseMLARef is glm5flash_sparse_mla's reference, absorbed NoPE MLA per query and head
// over the latents of its selected tokens:
//
//	qa = W_ukᵀ·q_h   p_j = softmax_j(qa·latent[sel_j]·scale)   out_h = W_uv·(Σ_j p_j·latent[sel_j])
//	q: [tokens, heads, dn]   kvb: [heads, dn+dv, rank]   latent: [positions, rank]   out: [tokens, heads, dv]
func SparseMLARef(out, q, kvb, latent []float32, sel [][]int32, tokens, heads, dn, dv, rank int, scale float32) error {
	if tokens <= 0 || heads <= 0 || dn <= 0 || dv <= 0 || rank <= 0 || len(sel) < tokens || len(out) < tokens*heads*dv ||
		len(q) < tokens*heads*dn || len(kvb) < heads*(dn+dv)*rank {
		return fmt.Errorf("sparse_mla reference: %d tokens × %d heads, dn %d, dv %d, rank %d: bad shape", tokens, heads, dn, dv, rank)
	}
	qa, ctx := make([]float32, rank), make([]float32, rank)
	for t := range tokens {
		toks := sel[t]
		for _, tok := range toks {
			if tok < 0 || int(tok+1)*rank > len(latent) {
				return fmt.Errorf("sparse_mla reference: token %d outside the latents", tok)
			}
		}
		p := make([]float32, len(toks))
		for h := range heads {
			wuk := kvb[h*(dn+dv)*rank : (h*(dn+dv)+dn)*rank]
			wuv := kvb[(h*(dn+dv)+dn)*rank : (h+1)*(dn+dv)*rank]
			qh := q[(t*heads+h)*dn : (t*heads+h+1)*dn]
			clear(qa)
			for d := range dn {
				for r := range rank {
					qa[r] += qh[d] * wuk[d*rank+r]
				}
			}
			mx := float32(math.Inf(-1))
			for j, tok := range toks {
				lat := latent[int(tok)*rank : int(tok+1)*rank]
				var s float32
				for r := range rank {
					s += qa[r] * lat[r]
				}
				p[j] = s * scale
				mx = max(mx, p[j])
			}
			var sum float32
			for j := range p {
				p[j] = float32(math.Exp(float64(p[j] - mx)))
				sum += p[j]
			}
			clear(ctx)
			for j, tok := range toks {
				lat := latent[int(tok)*rank : int(tok+1)*rank]
				for r := range rank {
					ctx[r] += p[j] / sum * lat[r]
				}
			}
			oh := out[(t*heads+h)*dv : (t*heads+h+1)*dv]
			for d := range dv {
				var s float32
				for r := range rank {
					s += wuv[d*rank+r] * ctx[r]
				}
				oh[d] = s
			}
		}
	}
	return nil
}

package ref

import (
	"fmt"
	"math"
)

// KDA is the shape of one Kimi Delta Attention layer's recurrence: Heads heads, each with a
// [DK, DV] fp32 state S.
type KDA struct{ Heads, DK, DV int }

func (a KDA) check(op string, state []float32, tokens int, q, k, v, g, beta, out []float32) error {
	if a.Heads <= 0 || a.DK <= 0 || a.DV <= 0 || tokens < 0 {
		return fmt.Errorf("ref.%s: bad shape %+v for %d tokens", op, a, tokens)
	}
	for _, c := range []struct {
		name string
		n    int
		want int
	}{{"state", len(state), a.Heads * a.DK * a.DV}, {"q", len(q), tokens * a.Heads * a.DK},
		{"k", len(k), tokens * a.Heads * a.DK}, {"g", len(g), tokens * a.Heads * a.DK},
		{"v", len(v), tokens * a.Heads * a.DV}, {"out", len(out), tokens * a.Heads * a.DV},
		{"beta", len(beta), tokens * a.Heads}} {
		if err := checkLen(op, c.name, c.n, c.want); err != nil {
			return err
		}
	}
	return nil
}

// KDAStep runs the delta-rule recurrence token by token (the decode form), per head:
//
//	q, k, g: [tokens, Heads, DK]   v, out: [tokens, Heads, DV]   beta: [tokens, Heads]
//	state:   [Heads, DK, DV], updated in place
//
//	S ← diag(exp(g_t))·S                 (per-key-channel decay; g is a log-decay)
//	S ← S + k_t ⊗ β_t·(v_t − Sᵀk_t)
//	out_t = Sᵀq_t
//
// q and k arrive already normalised and q scaled, as transformers' recurrent_kimi_delta_attention
// has them after its l2norm and scale.
func KDAStep(out, state, q, k, v, g, beta []float32, tokens int, a KDA) error {
	if err := a.check("KDAStep", state, tokens, q, k, v, g, beta, out); err != nil {
		return err
	}
	dk, dv := a.DK, a.DV
	mem := make([]float32, dv)
	for t := range tokens {
		for h := range a.Heads {
			S := state[h*dk*dv : (h+1)*dk*dv]
			o := t*a.Heads + h
			qt, kt, gt := q[o*dk:(o+1)*dk], k[o*dk:(o+1)*dk], g[o*dk:(o+1)*dk]
			vt, ot := v[o*dv:(o+1)*dv], out[o*dv:(o+1)*dv]
			clear(mem)
			for i := range dk {
				d := float32(math.Exp(float64(gt[i])))
				row := S[i*dv : (i+1)*dv]
				for j := range dv {
					row[j] *= d
					mem[j] += row[j] * kt[i]
				}
			}
			b := beta[o]
			for j := range dv {
				mem[j] = b * (vt[j] - mem[j]) // delta
			}
			clear(ot)
			for i := range dk {
				row := S[i*dv : (i+1)*dv]
				for j := range dv {
					row[j] += kt[i] * mem[j]
					ot[j] += row[j] * qt[i]
				}
			}
		}
	}
	return nil
}

// KDAChunked computes what KDAStep computes, chunk tokens at a time (the prefill form).
// Inside a chunk that starts from state S₀, with G_t = Σ_{s≤t} g_s (cumulative per channel)
// and Γ_t = exp(G_t):
//
//	u_s  = β_s·(v_s − S₀ᵀ(Γ_s⊙k_s) − Σ_{r<s} A_sr·u_r),   A_sr = Σ_c k_s[c]·exp(G_s[c]−G_r[c])·k_r[c]
//	out_t = S₀ᵀ(Γ_t⊙q_t) + Σ_{s≤t} (Σ_c q_t[c]·exp(G_t[c]−G_s[c])·k_s[c])·u_s
//	S    ← diag(Γ_C)·S₀ + Σ_s (exp(G_C−G_s)⊙k_s) ⊗ u_s
//
// (u_s is the delta β_s(v_s − S'ᵀk_s) of step s, solved by forward substitution.)
func KDAChunked(out, state, q, k, v, g, beta []float32, tokens, chunk int, a KDA) error {
	if err := a.check("KDAChunked", state, tokens, q, k, v, g, beta, out); err != nil {
		return err
	}
	if chunk <= 0 {
		return fmt.Errorf("ref.KDAChunked: chunk %d", chunk)
	}
	// The heads are independent: they are split across the worker pool, each participant
	// with its own scratch.
	t := kdaTasks.get()
	t.out, t.state, t.q, t.k, t.v, t.g, t.beta = out, state, q, k, v, g, beta
	// A chunk longer than the tokens is one chunk of the tokens: the scratch (chunk² pair
	// products a participant) is sized by what runs.
	t.tokens, t.chunk, t.a = tokens, min(chunk, tokens), a
	if n := parts(); len(t.scratch) < n {
		t.scratch = append(t.scratch, make([]kdaScratch, n-len(t.scratch))...)
	}
	grain := a.Heads
	if tokens*a.Heads*a.DK*a.DV >= minParallelMACs {
		grain = 1
	}
	parallelFor(&t.loop, t, a.Heads, grain)
	t.out, t.state, t.q, t.k, t.v, t.g, t.beta = nil, nil, nil, nil, nil, nil, nil
	kdaTasks.put(t)
	return nil
}

// kdaTask is one KDAChunked call, its heads a task of the worker pool.
type kdaTask struct {
	loop                         loop
	out, state, q, k, v, g, beta []float32
	tokens, chunk                int
	a                            KDA
	scratch                      []kdaScratch // per participant, kept across calls
}

// kdaScratch is a participant's scratch for one head: cumulative gates, deltas, next
// state, a pair's decays, the chunk's pair products (pairs), and per token and channel
// exp(G_t) and exp(G_C−G_t).
type kdaScratch struct {
	G                          []float64
	u, next, e, A, W, gam, dec []float32
}

var kdaTasks freeList[kdaTask]

func (t *kdaTask) run(part, lo, hi int) {
	a := t.a
	sc := &t.scratch[part]
	sc.G = growFloat64s(sc.G, t.chunk*a.DK)
	sc.u = growFloat32s(sc.u, t.chunk*a.DV)
	sc.next = growFloat32s(sc.next, a.DK*a.DV)
	sc.e = growFloat32s(sc.e, a.DK)
	sc.gam, sc.dec = growFloat32s(sc.gam, t.chunk*a.DK), growFloat32s(sc.dec, t.chunk*a.DK)
	sc.A, sc.W = growFloat32s(sc.A, t.chunk*t.chunk), growFloat32s(sc.W, t.chunk*t.chunk)
	for h := lo; h < hi; h++ {
		t.head(h, sc)
	}
}

// pairs fills, for the chunk's token pairs s < t, A[t·chunk+s] = Σ_c k_t[c]·exp(G_t[c]−G_s[c])·k_s[c]
// and W[t·chunk+s] = Σ_c q_t[c]·exp(G_t[c]−G_s[c])·k_s[c], and W[t·chunk+t] = q_t·k_t: both from one
// vector of decays a pair, exponentiated 8 at a time (expf, the scalar bits).
func (task *kdaTask) pairs(h, t0, C int, sc *kdaScratch) {
	q, k := task.q, task.k
	dk, H, stride := task.a.DK, task.a.Heads, task.chunk
	G, e, A, W := sc.G, sc.e, sc.A, sc.W
	at := func(t int) int { return (t0+t)*H + h }
	for t := range C {
		qt, kt := q[at(t)*dk:(at(t)+1)*dk], k[at(t)*dk:(at(t)+1)*dk]
		Gt := G[t*dk : (t+1)*dk]
		for s := range t {
			ks := k[at(s)*dk : (at(s)+1)*dk]
			Gs := G[s*dk : (s+1)*dk]
			for c := range dk {
				e[c] = float32(Gt[c] - Gs[c])
			}
			expfInPlace(e)
			var a, w float32
			for c := range dk {
				a += float32(kt[c]*e[c]) * ks[c]
				w += float32(qt[c]*e[c]) * ks[c]
			}
			A[t*stride+s], W[t*stride+s] = a, w
		}
		var w float32
		for c := range dk {
			w += qt[c] * kt[c]
		}
		W[t*stride+t] = w
	}
}

// expfInPlace sets x[i] = expf(x[i]), 8 at a time with AVX2: softmaxExpSum with scale 1
// and max 0 is exactly that (its sum is dropped).
func expfInPlace(x []float32) { softmaxExpSum(x, 1, 0) }

// head runs KDAChunked for head h over every chunk.
func (kt *kdaTask) head(h int, sc *kdaScratch) {
	G, u, next, A, W := sc.G, sc.u, sc.next, sc.A, sc.W
	out, state, q, k, v, g, beta := kt.out, kt.state, kt.q, kt.k, kt.v, kt.g, kt.beta
	dk, dv, H := kt.a.DK, kt.a.DV, kt.a.Heads
	chunk := kt.chunk
	S := state[h*dk*dv : (h+1)*dk*dv]
	for t0 := 0; t0 < kt.tokens; t0 += chunk {
		C := min(chunk, kt.tokens-t0)
		at := func(t int) int { return (t0+t)*H + h }
		for t := range C {
			gt := g[at(t)*dk : (at(t)+1)*dk]
			for c := range dk {
				prev := 0.0
				if t > 0 {
					prev = G[(t-1)*dk+c]
				}
				G[t*dk+c] = prev + float64(gt[c])
			}
		}
		// Γ_t = exp(G_t) and the decays to the chunk's end exp(G_C−G_s), 8 at a time. G_t
		// is rounded to float32 before its exp: a relative error of |G_t|·6e-8 on e^G_t,
		// at most 2.2e-8 absolute (at G_t = −1).
		last := (C - 1) * dk
		gam, dec := sc.gam[:C*dk], sc.dec[:C*dk]
		for i := range gam {
			gam[i] = float32(G[i])
			dec[i] = float32(G[last+i%dk] - G[i])
		}
		expfInPlace(gam)
		expfInPlace(dec)
		kt.pairs(h, t0, C, sc)
		// u: forward substitution.
		for s := range C {
			ks := k[at(s)*dk : (at(s)+1)*dk]
			us := u[s*dv : (s+1)*dv]
			copy(us, v[at(s)*dv:(at(s)+1)*dv])
			for c := range dk {
				axpy(-(gam[s*dk+c] * ks[c]), S[c*dv:(c+1)*dv], us)
			}
			for r := range s {
				axpy(-A[s*chunk+r], u[r*dv:(r+1)*dv], us)
			}
			b := beta[at(s)]
			for j := range dv {
				us[j] *= b
			}
		}
		// Outputs.
		for t := range C {
			qt := q[at(t)*dk : (at(t)+1)*dk]
			ot := out[at(t)*dv : (at(t)+1)*dv]
			clear(ot)
			for c := range dk {
				axpy(gam[t*dk+c]*qt[c], S[c*dv:(c+1)*dv], ot)
			}
			for s := 0; s <= t; s++ {
				axpy(W[t*chunk+s], u[s*dv:(s+1)*dv], ot)
			}
		}
		// State.
		for c := range dk {
			d := gam[last+c]
			row, nrow := S[c*dv:(c+1)*dv], next[c*dv:(c+1)*dv]
			for j := range dv {
				nrow[j] = d * row[j]
			}
			for s := range C {
				axpy(dec[s*dk+c]*k[at(s)*dk+c], u[s*dv:(s+1)*dv], nrow)
			}
		}
		copy(S, next)
	}
}

// CausalConvStep runs a depthwise causal convolution over tokens, carrying its state.
//
//	x, out: [tokens, channels]   w: [channels, kernel]   state: [channels, kernel−1] (oldest first)
//	out[t, c] = Σ_j w[c, j]·x̃[t − (kernel−1) + j, c], x̃ = state then x
//
// state is updated in place to the last kernel−1 inputs; no activation is applied.
func CausalConvStep(out, state, x, w []float32, tokens, channels, kernel int) error {
	if kernel < 1 || channels < 1 || tokens < 0 {
		return fmt.Errorf("ref.CausalConvStep: kernel %d, %d channels, %d tokens", kernel, channels, tokens)
	}
	if len(x) < tokens*channels || len(out) < tokens*channels || len(w) < channels*kernel || len(state) < channels*(kernel-1) {
		return fmt.Errorf("ref.CausalConvStep: short buffers for %d tokens × %d channels, kernel %d", tokens, channels, kernel)
	}
	m := kernel - 1
	for t := range tokens {
		for c := range channels {
			st := state[c*m : (c+1)*m]
			wc := w[c*kernel : (c+1)*kernel]
			xv := x[t*channels+c]
			s := wc[m] * xv
			for j := range m {
				s += wc[j] * st[j]
			}
			out[t*channels+c] = s
			if m > 0 {
				copy(st, st[1:])
				st[m-1] = xv
			}
		}
	}
	return nil
}

package ref

import (
	"fmt"
	"math"
)

// SiLU returns x·sigmoid(x).
func SiLU(x float32) float32 {
	return x / (1 + expf(-x))
}

// expf returns e^x in float32, within 2 ulp of the correctly rounded value (0 below
// -87.33, where e^x leaves float32's normal range; +Inf above 88.72): math.Exp in float64
// is twice its cost in the softmax and SiLU loops that dominate after the GEMMs. It
// splits x = n·ln2 + r with |r| ≤ ln2/2 and evaluates Cephes' degree-6 polynomial for e^r
// (Moshier, Cephes Math Library, expf.c).
func expf(x float32) float32 {
	if !(x >= expfMinArg && x <= expfMaxArg) {
		switch {
		case x < expfMinArg:
			return 0
		case x != x:
			return x
		}
		return float32(math.Exp(float64(x))) // up to +Inf
	}
	// Every product is rounded on its own (float32(...)): the Go compiler may fuse a
	// multiply-add into an FMA (GOAMD64=v3, arm64), which rounds once and would make
	// expf differ from EXPF8's vector form (expf_amd64.s) in the last bit.
	t := float32(x*expfLog2e) + expfMagic
	n := int32(math.Float32bits(t)) - int32(math.Float32bits(expfMagic))
	fn := t - expfMagic
	r := x - float32(fn*expfLn2Hi) - float32(fn*expfLn2Lo)
	p := float32(expfP0*r) + expfP1
	p = float32(p*r) + expfP2
	p = float32(p*r) + expfP3
	p = float32(p*r) + expfP4
	p = float32(p*r) + expfP5
	p = float32(float32(p*r)*r) + r + 1
	return p * math.Float32frombits(uint32(n+127)<<23)
}

// expf's constants (the vector form in expf_amd64.s reads them too).
const (
	expfLog2e  float32 = 1.44269504088896341
	expfLn2Hi  float32 = 0.693359375 // ln2 = ln2Hi + ln2Lo, ln2Hi exact in few bits
	expfLn2Lo  float32 = -2.12194440e-4
	expfMagic  float32 = 12582912 // 1.5·2²³: adding it rounds to an integer, in the low mantissa bits
	expfMinArg float32 = -87.33654
	expfMaxArg float32 = 88.37626 // e^x below 2^127.5: n ≤ 127
	expfP0     float32 = 1.9875691500e-4
	expfP1     float32 = 1.3981999507e-3
	expfP2     float32 = 8.3334519073e-3
	expfP3     float32 = 4.1665795894e-2
	expfP4     float32 = 1.6666665459e-1
	expfP5     float32 = 5.0000001201e-1
)

// SiLUMul applies the gated activation of a fused gate/up projection.
//
//	gateUp: [rows, 2*dim] (gate in columns [0, dim), up in [dim, 2*dim))   out: [rows, dim]
//	out[r, i] = SiLU(gateUp[r, i]) * gateUp[r, dim+i]
//
// Many rows are split across the package's worker pool.
func SiLUMul(out, gateUp []float32, rows, dim int) error {
	if err := checkDims("SiLUMul", rows, dim); err != nil {
		return err
	}
	if err := checkLen("SiLUMul", "gateUp", len(gateUp), rows*2*dim); err != nil {
		return err
	}
	if err := checkLen("SiLUMul", "out", len(out), rows*dim); err != nil {
		return err
	}
	if g := rowGrain(dim); rows > g {
		t := siluMulTasks.get()
		t.out, t.gateUp, t.dim = out, gateUp, dim
		parallelFor(&t.loop, t, rows, g)
		t.out, t.gateUp = nil, nil
		siluMulTasks.put(t)
		return nil
	}
	siluMulRows(out, gateUp, dim, 0, rows)
	return nil
}

// siluMulTask is SiLUMul's rows as a task of the worker pool.
type siluMulTask struct {
	loop        loop
	out, gateUp []float32
	dim         int
}

var siluMulTasks freeList[siluMulTask]

func (t *siluMulTask) run(_, lo, hi int) { siluMulRows(t.out, t.gateUp, t.dim, lo, hi) }

// siluMulRows is SiLUMul of rows [lo, hi).
func siluMulRows(out, gateUp []float32, dim, lo, hi int) {
	inf := float32(math.Inf(1))
	for r := lo; r < hi; r++ {
		gu := gateUp[r*2*dim : (r+1)*2*dim]
		siluMulClamped(out[r*dim:(r+1)*dim], gu[:dim], gu[dim:], inf)
	}
}

// siluMulClamped sets out[i] = SiLU(min(gate[i], lim))·min(max(up[i], −lim), lim) (lim =
// +Inf clamps nothing: out[i] = SiLU(gate[i])·up[i]): 8 at a time with AVX2
// (siluMulVector), the scalar expression on the blocks it stops at and the tail, with the
// same bits.
func siluMulClamped(out, gate, up []float32, lim float32) {
	n := len(gate)
	i := 0
	for n-i >= 8 {
		i += siluMulVector(out[i:], gate[i:], up[i:], lim)
		if n-i < 8 {
			break
		}
		siluMulScalar(out[i:i+8], gate[i:i+8], up[i:i+8], lim)
		i += 8
	}
	siluMulScalar(out[i:], gate[i:], up[i:], lim)
}

// siluMulScalar sets out[i] = SiLU(min(gate[i], lim))·min(max(up[i], −lim), lim), SiLU's
// own expression.
func siluMulScalar(out, gate, up []float32, lim float32) {
	for i, v := range gate {
		v = min(v, lim)
		out[i] = v / (1 + expf(-v)) * min(max(up[i], -lim), lim)
	}
}

// SiLUMulClamped is the clamped SwiGLU of DeepSeek-V4 and GLM-5 (swiglu_limit):
//
//	out[i] = SiLU(min(gate[i], limit)) · min(max(up[i], −limit), limit)
//
// with Go's min and max (a NaN stays NaN; limit = +Inf clamps nothing). gate, up and out
// have the same length; out may alias gate or up. Long inputs are split across the
// package's worker pool.
func SiLUMulClamped(out, gate, up []float32, limit float32) error {
	if len(gate) != len(up) || len(out) < len(gate) {
		return errShape("SiLUMulClamped", "out, gate and up must have the same length (got %d, %d, %d)", len(out), len(gate), len(up))
	}
	if n := len(gate); n > 2*minParallelElems {
		t := clampTasks.get()
		t.out, t.gate, t.up, t.lim = out, gate, up, limit
		parallelFor(&t.loop, t, n, minParallelElems)
		t.out, t.gate, t.up = nil, nil, nil
		clampTasks.put(t)
		return nil
	}
	siluMulClamped(out[:len(gate)], gate, up, limit)
	return nil
}

// clampTask is SiLUMulClamped's elements as a task of the worker pool.
type clampTask struct {
	loop          loop
	out, gate, up []float32
	lim           float32
}

var clampTasks freeList[clampTask]

func (t *clampTask) run(_, lo, hi int) {
	siluMulClamped(t.out[lo:hi], t.gate[lo:hi], t.up[lo:hi], t.lim)
}

// SiLUMulSplit is SiLUMul with the gate and up projections in separate tensors.
//
//	gate, up: [rows, dim]   out: [rows, dim]
//	out[r, i] = SiLU(gate[r, i]) * up[r, i]
//
// out may alias gate or up.
func SiLUMulSplit(out, gate, up []float32, rows, dim int) error {
	if err := checkDims("SiLUMulSplit", rows, dim); err != nil {
		return err
	}
	n := rows * dim
	for _, s := range []struct {
		name string
		len  int
	}{{"gate", len(gate)}, {"up", len(up)}, {"out", len(out)}} {
		if err := checkLen("SiLUMulSplit", s.name, s.len, n); err != nil {
			return err
		}
	}
	siluMulClamped(out[:n], gate[:n], up[:n], float32(math.Inf(1)))
	return nil
}

// Softmax replaces each row of x by its softmax, computed stably (the row's maximum is
// subtracted first, sums in float64).
//
//	x: [rows, n]
func Softmax(x []float32, rows, n int) error {
	if err := checkDims("Softmax", rows, n); err != nil {
		return err
	}
	if err := checkLen("Softmax", "x", len(x), rows*n); err != nil {
		return err
	}
	for r := 0; r < rows; r++ {
		softmaxRow(x[r*n : (r+1)*n])
	}
	return nil
}

func softmaxRow(row []float32) {
	if len(row) == 0 {
		return
	}
	mx := row[0]
	for _, v := range row[1:] {
		mx = max(mx, v)
	}
	var sum float64
	for i, v := range row {
		e := math.Exp(float64(v - mx))
		row[i] = float32(e)
		sum += e
	}
	inv := float32(1 / sum)
	for i := range row {
		row[i] *= inv
	}
}

// SoftmaxSink turns each row of scores into attention weights with a sink: row r becomes
// softmax([x[r]·scale, sinks[r]]) without the sink's own weight, so the row sums to less
// than one by what the sink takes (DeepSeek-V4's and gpt-oss's per-head sinks). The
// exponentials are expf's, 8 at a time with AVX2 (the scalar bits); sums in float64.
//
//	x: [rows, n]   sinks: [rows]
func SoftmaxSink(x []float32, rows, n int, scale float32, sinks []float32) error {
	if err := checkDims("SoftmaxSink", rows, n); err != nil {
		return err
	}
	if err := checkLen("SoftmaxSink", "x", len(x), rows*n); err != nil {
		return err
	}
	if err := checkLen("SoftmaxSink", "sinks", len(sinks), rows); err != nil {
		return err
	}
	for r := range rows {
		row := x[r*n : (r+1)*n]
		mx := sinks[r]
		if n > 0 {
			mx = max(mx, rowMax(row, scale))
		}
		sum := softmaxExpSum(row, scale, mx) + float64(expf(sinks[r]-mx))
		inv := float32(1 / sum)
		for i := range row {
			row[i] *= inv
		}
	}
	return nil
}

// Embedding gathers one row of table per id.
//
//	table: [vocab, dim]   ids: [tokens]   out: [tokens, dim]
//
// vocab is len(table)/dim; an id outside [0, vocab) is an error.
func Embedding(out, table []float32, ids []int32, dim int) error {
	if dim <= 0 {
		return fmt.Errorf("ref.Embedding: dim must be positive, got %d", dim)
	}
	if len(table)%dim != 0 {
		return fmt.Errorf("ref.Embedding: table length %d is not a multiple of dim %d", len(table), dim)
	}
	if err := checkLen("Embedding", "out", len(out), len(ids)*dim); err != nil {
		return err
	}
	vocab := len(table) / dim
	for t, id := range ids {
		if id < 0 || int(id) >= vocab {
			return fmt.Errorf("ref.Embedding: token %d has id %d outside the vocabulary [0, %d)", t, id, vocab)
		}
		copy(out[t*dim:(t+1)*dim], table[int(id)*dim:(int(id)+1)*dim])
	}
	return nil
}

// Argmax returns the index of the largest element of x (the first one on a tie), or -1
// when x is empty. NaNs are never chosen.
func Argmax(x []float32) int {
	best := -1
	for i, v := range x {
		if v != v {
			continue
		}
		if best < 0 || v > x[best] {
			best = i
		}
	}
	return best
}

// ArgmaxRows writes the Argmax of each row of x into out, 0 for a row of NaNs (engine's
// sampler takes token 0 there; argmax.cu's spec).
//
//	x: [rows, n]   out: [rows]
func ArgmaxRows(out []int32, x []float32, rows, n int) error {
	if err := checkDims("ArgmaxRows", rows, n); err != nil {
		return err
	}
	if err := checkLen("ArgmaxRows", "x", len(x), rows*n); err != nil {
		return err
	}
	if err := checkLen("ArgmaxRows", "out", len(out), rows); err != nil {
		return err
	}
	for r := 0; r < rows; r++ {
		out[r] = int32(max(Argmax(x[r*n:(r+1)*n]), 0))
	}
	return nil
}

func errShape(op, format string, args ...any) error {
	return fmt.Errorf("ref."+op+": "+format, args...)
}

// AxpyF64 adds a·x to acc element by element, x widened to float64: acc[i] += a·float64(x[i])
// for i < len(x) (acc at least as long), each product and sum rounded in float64 (8 at a
// time with AVX2, the same bits). The weighted sum of float32 rows into a float64
// accumulator, as attention loops written in float64 need.
func AxpyF64(acc []float64, a float64, x []float32) {
	acc = acc[:len(x)]
	i := axpyF64Vector(acc, a, x)
	for ; i < len(x); i++ {
		acc[i] += float64(a * float64(x[i])) // rounded before the sum, as the vector form: no FMA
	}
}

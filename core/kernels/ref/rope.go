package ref

import (
	"fmt"
	"math"
)

// RopeTable holds the cosines and sines of rotary position embeddings for positions
// [0, MaxPos), precomputed once per model.
//
//	Cos, Sin: [MaxPos, Dim/2]   Cos[p, i] = cos(p · invFreq[i]) · Scale
//
// Dim is the number of rotated dimensions of a head; a partial rotary embedding has Dim
// smaller than the head size and leaves the remaining dimensions unchanged.
type RopeTable struct {
	Dim    int
	MaxPos int
	Cos    []float32
	Sin    []float32
}

// NewRopeTable builds the table of the standard rotary embedding:
// invFreq[i] = theta^(-2i/dim) for i in [0, dim/2).
func NewRopeTable(dim, maxPos int, theta float64) (*RopeTable, error) {
	if dim <= 0 || dim%2 != 0 {
		return nil, fmt.Errorf("ref.NewRopeTable: rotary dim must be positive and even, got %d", dim)
	}
	if theta <= 0 {
		return nil, fmt.Errorf("ref.NewRopeTable: theta must be positive, got %g", theta)
	}
	inv := make([]float64, dim/2)
	for i := range inv {
		inv[i] = 1 / math.Pow(theta, float64(2*i)/float64(dim))
	}
	return NewRopeTableFreqs(inv, maxPos, 1)
}

// NewRopeTableFreqs builds a table from explicit inverse frequencies (one per rotated pair,
// as scaled schemes such as YaRN or Llama-3 compute them) and a magnitude scale applied to
// both cos and sin (YaRN's mscale; 1 otherwise).
func NewRopeTableFreqs(invFreq []float64, maxPos int, scale float32) (*RopeTable, error) {
	if len(invFreq) == 0 {
		return nil, fmt.Errorf("ref.NewRopeTableFreqs: no inverse frequencies")
	}
	if maxPos <= 0 {
		return nil, fmt.Errorf("ref.NewRopeTableFreqs: maxPos must be positive, got %d", maxPos)
	}
	half := len(invFreq)
	t := &RopeTable{Dim: 2 * half, MaxPos: maxPos, Cos: make([]float32, maxPos*half), Sin: make([]float32, maxPos*half)}
	for p := range maxPos {
		for i, f := range invFreq {
			a := float64(p) * f
			t.Cos[p*half+i] = float32(math.Cos(a)) * scale
			t.Sin[p*half+i] = float32(math.Sin(a)) * scale
		}
	}
	return t, nil
}

// RoPENeoX rotates x in place with the half-split (GPT-NeoX, Llama) layout: dimension i of
// a head pairs with dimension i + Dim/2.
//
//	x: [rows, heads, headDim]   pos: [rows]
//	for i < Dim/2:  (x[i], x[i+Dim/2]) ← (x[i]·c − x[i+Dim/2]·s, x[i+Dim/2]·c + x[i]·s)
//	with c, s = Cos[pos[r], i], Sin[pos[r], i]; dimensions ≥ Dim are left as they are.
func (t *RopeTable) RoPENeoX(x []float32, pos []int32, rows, heads, headDim int) error {
	return t.rotate("RoPENeoX", x, pos, rows, heads, headDim, false)
}

// RoPEInterleaved rotates x in place with the interleaved (GPT-J) layout: dimension 2i of a
// head pairs with dimension 2i+1.
//
//	x: [rows, heads, headDim]   pos: [rows]
//	for i < Dim/2:  (x[2i], x[2i+1]) ← (x[2i]·c − x[2i+1]·s, x[2i+1]·c + x[2i]·s)
func (t *RopeTable) RoPEInterleaved(x []float32, pos []int32, rows, heads, headDim int) error {
	return t.rotate("RoPEInterleaved", x, pos, rows, heads, headDim, true)
}

func (t *RopeTable) rotate(op string, x []float32, pos []int32, rows, heads, headDim int, interleaved bool) error {
	if t == nil {
		return fmt.Errorf("ref.%s: nil RopeTable", op)
	}
	if err := checkDims(op, rows, heads, headDim); err != nil {
		return err
	}
	if t.Dim > headDim {
		return fmt.Errorf("ref.%s: rotary dim %d exceeds head dim %d", op, t.Dim, headDim)
	}
	if err := checkLen(op, "x", len(x), rows*heads*headDim); err != nil {
		return err
	}
	if err := checkLen(op, "pos", len(pos), rows); err != nil {
		return err
	}
	for r, p := range pos[:rows] {
		if p < 0 || int(p) >= t.MaxPos {
			return fmt.Errorf("ref.%s: row %d has position %d outside the table [0, %d)", op, r, p, t.MaxPos)
		}
	}
	if g := rowGrain(heads * headDim); rows > g {
		rt := ropeTasks.get()
		rt.t, rt.x, rt.pos, rt.heads, rt.headDim, rt.interleaved = t, x, pos, heads, headDim, interleaved
		parallelFor(&rt.loop, rt, rows, g)
		rt.t, rt.x, rt.pos = nil, nil, nil
		ropeTasks.put(rt)
		return nil
	}
	t.rotateRows(x, pos, heads, headDim, interleaved, 0, rows)
	return nil
}

// rotateRows is rotate of rows [lo, hi), their positions checked.
func (t *RopeTable) rotateRows(x []float32, pos []int32, heads, headDim int, interleaved bool, lo, hi int) {
	half := t.Dim / 2
	for r := lo; r < hi; r++ {
		p := int(pos[r])
		cos := t.Cos[p*half : (p+1)*half]
		sin := t.Sin[p*half : (p+1)*half]
		for h := 0; h < heads; h++ {
			v := x[(r*heads+h)*headDim : (r*heads+h+1)*headDim]
			i := 0
			if !interleaved { // the halves are contiguous: 8 pairs at a time with AVX2
				i = ropeNeoXVector(v[:half], v[half:2*half], cos, sin)
			}
			for ; i < half; i++ {
				a, b := i, i+half
				if interleaved {
					a, b = 2*i, 2*i+1
				}
				// Each product rounded before the sum (float32()), as the vector form
				// does: the compiler may otherwise fuse them into FMAs.
				x0, x1 := v[a], v[b]
				v[a] = float32(x0*cos[i]) - float32(x1*sin[i])
				v[b] = float32(x1*cos[i]) + float32(x0*sin[i])
			}
		}
	}
}

// ropeTask is rotate's rows as a task of the worker pool.
type ropeTask struct {
	loop           loop
	t              *RopeTable
	x              []float32
	pos            []int32
	heads, headDim int
	interleaved    bool
}

var ropeTasks freeList[ropeTask]

func (rt *ropeTask) run(_, lo, hi int) {
	rt.t.rotateRows(rt.x, rt.pos, rt.heads, rt.headDim, rt.interleaved, lo, hi)
}

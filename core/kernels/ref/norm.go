package ref

import "math"

// RMSNorm normalises each row by its root mean square and scales it by w.
//
//	x: [rows, dim]   w: [dim]   out: [rows, dim]
//	out[r, i] = x[r, i] / sqrt(mean_j(x[r, j]²) + eps) * w[i]
//
// out may alias x. The sum of squares is accumulated in float64.
func RMSNorm(out, x, w []float32, rows, dim int, eps float32) error {
	if err := checkLen("RMSNorm", "w", len(w), dim); err != nil {
		return err
	}
	return rmsNorm("RMSNorm", out, x, w, rows, dim, eps)
}

// rmsNorm is RMSNorm, and RMSNormUnweighted when w is nil.
func rmsNorm(op string, out, x, w []float32, rows, dim int, eps float32) error {
	if err := checkDims(op, rows, dim); err != nil {
		return err
	}
	if err := checkLen(op, "x", len(x), rows*dim); err != nil {
		return err
	}
	if err := checkLen(op, "out", len(out), rows*dim); err != nil {
		return err
	}
	if g := rowGrain(dim); rows > g {
		t := normTasks.get()
		t.out, t.x, t.w, t.dim, t.eps = out, x, w, dim, eps
		parallelFor(&t.loop, t, rows, g)
		t.out, t.x, t.w = nil, nil, nil
		normTasks.put(t)
		return nil
	}
	rmsNormRows(out, x, w, dim, eps, 0, rows)
	return nil
}

// normTask is rmsNorm's rows as a task of the worker pool.
type normTask struct {
	loop      loop
	out, x, w []float32
	dim       int
	eps       float32
}

var normTasks freeList[normTask]

func (t *normTask) run(_, lo, hi int) { rmsNormRows(t.out, t.x, t.w, t.dim, t.eps, lo, hi) }

// rmsNormRows is rmsNorm of rows [lo, hi). The sum of squares runs in four float64
// partial sums (element i in sum i%4), added pairwise at the end: one running sum would
// wait on each add's latency.
func rmsNormRows(out, x, w []float32, dim int, eps float32, lo, hi int) {
	for r := lo; r < hi; r++ {
		row := x[r*dim : (r+1)*dim]
		var s0, s1, s2, s3 float64
		i := 0
		for ; i+4 <= dim; i += 4 {
			v0, v1, v2, v3 := float64(row[i]), float64(row[i+1]), float64(row[i+2]), float64(row[i+3])
			s0 += v0 * v0
			s1 += v1 * v1
			s2 += v2 * v2
			s3 += v3 * v3
		}
		for ; i < dim; i++ {
			v := float64(row[i])
			s0 += v * v
		}
		ss := (s0 + s1) + (s2 + s3)
		inv := float32(1 / math.Sqrt(ss/float64(dim)+float64(eps)))
		o := out[r*dim : (r+1)*dim]
		if w == nil {
			for i := range dim {
				o[i] = row[i] * inv
			}
			continue
		}
		for i := range dim {
			o[i] = row[i] * inv * w[i]
		}
	}
}

// Add computes out = a + b element by element; out may alias a or b. Long vectors are
// split across the package's worker pool.
func Add(out, a, b []float32) error {
	if len(a) != len(b) || len(out) < len(a) {
		return errShape("Add", "out, a and b must have the same length (got %d, %d, %d)", len(out), len(a), len(b))
	}
	if len(a) > 2*minParallelElems {
		t := addTasks.get()
		t.out, t.a, t.b = out, a, b
		parallelFor(&t.loop, t, len(a), minParallelElems)
		t.out, t.a, t.b = nil, nil, nil
		addTasks.put(t)
		return nil
	}
	add(out, a, b)
	return nil
}

func add(out, a, b []float32) {
	out = out[:len(a)]
	b = b[:len(a)]
	for i := range a {
		out[i] = a[i] + b[i]
	}
}

// addTask is Add's elements as a task of the worker pool.
type addTask struct {
	loop      loop
	out, a, b []float32
}

var addTasks freeList[addTask]

func (t *addTask) run(_, lo, hi int) { add(t.out[lo:hi], t.a[lo:hi], t.b[lo:hi]) }

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
	for r := 0; r < rows; r++ {
		row := x[r*dim : (r+1)*dim]
		var ss float64
		for _, v := range row {
			ss += float64(v) * float64(v)
		}
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
	return nil
}

// Add computes out = a + b element by element; out may alias a or b.
func Add(out, a, b []float32) error {
	if len(a) != len(b) || len(out) < len(a) {
		return errShape("Add", "out, a and b must have the same length (got %d, %d, %d)", len(out), len(a), len(b))
	}
	for i := range a {
		out[i] = a[i] + b[i]
	}
	return nil
}

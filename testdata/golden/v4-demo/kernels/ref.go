package kernels

import (
	"fmt"

	"github.com/resin-llm/resin/core/kernels/ref"
)

// AddRMSNormRef is the reference of v4demo_add_rmsnorm, on core/kernels/ref:
//
//	residual: [rows, dim]   x: [rows, dim]   w: [dim]   out: [rows, dim]
//	residual += x;  out = RMSNorm(residual) * w
func AddRMSNormRef(out, residual, x, w []float32, rows, dim int, eps float32) error {
	if err := ref.Add(residual, residual, x); err != nil {
		return fmt.Errorf("add_rmsnorm reference: %w", err)
	}
	if err := ref.RMSNorm(out, residual, w, rows, dim, eps); err != nil {
		return fmt.Errorf("add_rmsnorm reference: %w", err)
	}
	return nil
}

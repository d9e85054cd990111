package gpurunner

import "fmt"

// StackFP8 stacks FP8 weights of one input size by rows into one weight (a gate and an
// up projection into one GEMM): every part but the last must fill whole 128-row scale
// blocks, else a stacked block would need two scales and StackFP8 refuses it (the caller
// keeps the parts apart or uses their dequantised values).
func StackFP8(parts ...PackedFP8) (PackedFP8, error) {
	if len(parts) == 0 {
		return PackedFP8{}, fmt.Errorf("gpurunner: stacking no fp8 weights")
	}
	s := PackedFP8{In: parts[0].In}
	for i, p := range parts {
		if err := p.Check(); err != nil {
			return PackedFP8{}, fmt.Errorf("gpurunner: stack part %d: %w", i, err)
		}
		if p.In != s.In || p.Experts > 1 {
			return PackedFP8{}, fmt.Errorf("gpurunner: stack part %d is %d × [%d, %d], want one weight of %d inputs", i, max(p.Experts, 1), p.Out, p.In, s.In)
		}
		if i < len(parts)-1 && p.Out%128 != 0 {
			return PackedFP8{}, fmt.Errorf("gpurunner: stack part %d has %d rows, not whole 128-row scale blocks", i, p.Out)
		}
		s.Out += p.Out
		s.W = append(s.W, p.W...)
		s.Scale = append(s.Scale, p.Scale...)
	}
	return s, nil
}

// Expert returns expert e of an FP8 bank (Experts > 1) as one weight, sharing its bytes.
func (p *PackedFP8) Expert(e int) (PackedFP8, error) {
	if err := p.Check(); err != nil {
		return PackedFP8{}, err
	}
	if p.Experts <= 1 || e < 0 || e >= p.Experts {
		return PackedFP8{}, fmt.Errorf("gpurunner: expert %d of an fp8 bank of %d", e, max(p.Experts, 1))
	}
	n, ns := p.Out*p.In, ((p.Out+127)/128)*((p.In+127)/128)
	return PackedFP8{Out: p.Out, In: p.In, W: p.W[e*n : (e+1)*n], Scale: p.Scale[e*ns : (e+1)*ns]}, nil
}

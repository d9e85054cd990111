package cli

import (
	"fmt"
	"io"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
)

// DTypeOpener opens a model with its CPU projections held and multiplied in dtype (fp32,
// bf16 or int8: ref.ParseDType), the shape of a model package's OpenDType.
type DTypeOpener func(dir string, cacheBytes int64, dtype string) (engine.Runner, *kvslab.Pool, error)

// WithDType gives the model's dtype opener: the commands then take --dtype fp32|bf16|int8
// for the CPU runner.
func (m *ModelDir) WithDType(open DTypeOpener) *ModelDir {
	m.dtypeOpen = open
	return m
}

// checkDType parses --dtype and refuses it where it does not apply: anything but fp32 on
// the GPU runner or the speculative one, or for a model without a dtype opener.
func (m *ModelDir) checkDType() (ref.DType, error) {
	dt, err := ref.ParseDType(m.dtype)
	if err != nil {
		return "", fmt.Errorf("--dtype: %w", err)
	}
	if dt == ref.DTypeFP32 {
		return dt, nil
	}
	switch {
	case m.dtypeOpen == nil:
		return "", fmt.Errorf("--dtype %s: model %s runs fp32 only", dt, m.name)
	case m.device.CUDA():
		return "", fmt.Errorf("--dtype %s: only the CPU runner holds weights in another dtype; use --device cpu or --dtype fp32", dt)
	case m.specTokens > 0:
		return "", fmt.Errorf("--dtype %s: the speculative runner runs fp32 only; drop --num-speculative-tokens or use --dtype fp32", dt)
	}
	return dt, nil
}

// noteDType says which dtype and kernel the CPU runner's products run on, at startup.
func noteDType(w io.Writer, dt ref.DType) {
	fmt.Fprintf(w, "note: CPU weights %s\n", dt.Kernel())
}

package main

import (
	"errors"
	"fmt"

	"github.com/resin-llm/resin/core/kernels/ref"
)

// checkDType parses --dtype and refuses it where it does not apply: anything but fp32
// without --model, on the GPU, speculative, DSpark, or split over ranks (tp, ep, dp, cp),
// none of which holds weights in another dtype yet. The model's own refusal (no
// OpenDType in the registry) comes at open.
func (f *runtimeFlags) checkDType() error {
	dt, err := ref.ParseDType(f.dtype)
	if err != nil {
		return fmt.Errorf("--dtype: %w", err)
	}
	f.dt = dt
	switch {
	case dt == ref.DTypeFP32:
		return nil
	case f.model == "":
		return fmt.Errorf("--dtype %s needs --model NAME: the test runner has no weights", dt)
	case f.device.CUDA():
		return fmt.Errorf("--dtype %s: only the CPU runner holds weights in another dtype; use --device cpu or --dtype fp32", dt)
	case f.specTokens > 0 || f.spec.DSpark():
		return fmt.Errorf("--dtype %s: the speculative runners run fp32 only; drop the speculative flags or use --dtype fp32", dt)
	case f.tp.size > 1 || f.tp.ep > 1 || f.dp.size > 1 || f.cp.size > 1:
		return errors.New("--dtype " + string(dt) + ": the split runners (--tp, --ep, --dp, --cp) run fp32 only; use --dtype fp32")
	}
	return nil
}

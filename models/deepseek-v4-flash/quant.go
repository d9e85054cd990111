package deepseekv4flash

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/resin-llm/resin/core/weights"
)

// parseQuantization parses quantization_config with weights.ParseQuantization (fine-grained
// FP8 with FP4 experts; the ignore and modules_to_not_convert lists, whose modules
// Checkpoint.Dequantize then requires unquantized), refusing an NVIDIA ModelOpt config by
// name: core/weights reads ModelOpt's FP8 and NVFP4, but this model's loader knows neither
// its scale tensors (weight_scale, weight_scale_2, input_scale) nor a V4 checkpoint made
// with it to test against.
func parseQuantization(raw json.RawMessage) (*weights.Quant, error) {
	var fields map[string]json.RawMessage
	var method string
	if json.Unmarshal(raw, &fields) == nil && json.Unmarshal(fields["quant_method"], &method) == nil && strings.EqualFold(method, "modelopt") {
		return nil, fmt.Errorf(`quantization_config.quant_method: %w: "modelopt" (NVIDIA ModelOpt FP8/NVFP4) is not supported by this model: it loads DeepSeek's fine-grained FP8 (quant_method "fp8", FP4 experts)`, weights.ErrFormat)
	}
	return weights.ParseQuantization(raw)
}

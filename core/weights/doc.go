// Package weights reads and writes Hugging Face checkpoints: config.json, safetensors files
// (single or sharded through model.safetensors.index.json) with their HF tensor names, and
// converts between the stored dtypes (BF16, F16, F32, F8_E4M3, F8_E5M2, F8_E8M0) and float32.
//
// Quantized checkpoints (DeepSeek-V3/V4 and others transformers loads with
// FineGrainedFP8Config) are dequantized to float32 as they load: ParseQuantization reads
// config.json's quantization_config, and a model reads each quantized weight with
// Checkpoint.Dequantize (FP8 e4m3 with block scales, FP4 e2m1 experts with per-32 scales,
// scales in F32, BF16 or ue8m0). A load shows its progress on stderr when that is a
// terminal (SetProgress changes where it goes).
//
// A model package maps its parameters to HF names and asks a Checkpoint for them by name and
// shape; a missing tensor or a shape mismatch is an error naming the tensor, never a silently
// zero weight.
package weights

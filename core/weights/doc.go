// Package weights reads and writes Hugging Face checkpoints: config.json, safetensors files
// (single or sharded through model.safetensors.index.json) with their HF tensor names, and
// converts between the stored dtypes (BF16, F16, F32, F8_E4M3, F8_E5M2) and float32.
//
// A model package maps its parameters to HF names and asks a Checkpoint for them by name and
// shape; a missing tensor or a shape mismatch is an error naming the tensor, never a silently
// zero weight.
package weights

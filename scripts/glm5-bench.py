"""Measures a mid-size GLM-5.3-Flash text model (CONFIG, fp32, random weights) in
transformers 5.23.0 on torch's CPU path, and prints it side by side with the Go runtime's
figures (the shared part is scripts/torchbench.py).

Run through scripts/glm5-bench.sh, which runs the Go benchmarks (BenchmarkGLMPrefill,
BenchmarkGLMDecode in models/glm-5-flash) on the same config (it reads CONFIG from
`--print-config`) with GOMAXPROCS equal to the thread count here.

  glm5-bench.py --print-config
  glm5-bench.py [--threads N] [--runs 3] [--prompt 256] [--steps 16]
                [--go-bench FILE] [--go-profile FILE]

Batch 1 and 4; decode goes through transformers' DynamicCache with its KDA conv/recurrent
states. transformers runs KDA and the short convolution through its reference PyTorch
fallbacks (flash-linear-attention and causal_conv1d are CUDA packages).
"""
import json

import torchbench

# KDA and MLA-DSA layers 2:1 (the indexer's top-k of 16 pools of 8 cuts at a 256-token
# prompt), a dense MLP then MoEs of 16 experts top-4 with a shared one, 4 mHC streams: the
# Go benchmarks' default (benchConfigJSON in models/glm-5-flash/bench_test.go).
CONFIG = torchbench.go_config("glm-5-flash")
BATCHES = (1, 4)


def build_model():
    import torch
    from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration
    cfg = {k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type", "torch_dtype")}
    config = Glm5NextConfig(**json.loads(json.dumps(cfg)))
    config._attn_implementation = "eager"
    torch.manual_seed(1)
    model = Glm5NextForConditionalGeneration._from_config(config, dtype=torch.float32).eval()
    torchbench.init_linear(model, torch.Generator().manual_seed(1), skip=("embed", "visual"))
    return model


if __name__ == "__main__":
    torchbench.main(CONFIG, BATCHES, build_model, bench="GLM", prompt=256, steps=16)

"""Measures a mid-size DeepSeek-V4 (CONFIG, fp32, random weights) in transformers 5.23.0 on
torch's CPU path, and prints it side by side with the Go runtime's figures (the shared part
is scripts/torchbench.py).

Run through scripts/deepseek-v4-bench.sh, which runs the Go benchmarks on the same config
(it reads CONFIG from `--print-config`) with GOMAXPROCS equal to the thread count here.

  deepseek-v4-bench.py --print-config
  deepseek-v4-bench.py [--threads N] [--runs 3] [--prompt 512] [--steps 32]
                       [--go-bench FILE] [--go-profile FILE]

Batch 1 and 8.
"""
import torchbench

# Every layer kind (sliding, CSA ratio 4 with an indexer whose top-k cuts at a 512-token
# prompt, HCA ratio 32), hash and learned routing, 16 experts top-4 and a shared one: the Go
# benchmarks' default (benchConfigJSON in models/deepseek-v4-flash/bench_test.go).
CONFIG = torchbench.go_config("deepseek-v4-flash")
BATCHES = (1, 8)


def build_model():
    import torch
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
    config = DeepseekV4Config(**{k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type")})
    config._attn_implementation = "eager"
    torch.manual_seed(1)
    model = DeepseekV4ForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, t in model.named_buffers():
            if name.endswith("tid2eid"):  # distinct random experts per token, as Go's RandomWeights
                k = t.shape[1]
                t.copy_(torch.stack([torch.randperm(config.n_routed_experts, generator=gen)[:k]
                                     for _ in range(t.shape[0])]))
    torchbench.init_linear(model, gen)
    return model


if __name__ == "__main__":
    torchbench.main(CONFIG, BATCHES, build_model, bench="V4", prompt=512, steps=32)

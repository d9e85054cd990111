"""A naive forward of the model: float64, dense causal attention over the whole sequence,
no cache and no plan. It is the oracle the paged forward (model.py) is tested against and,
when kernels are ported to Go or CUDA, the tokens the port must reproduce:

    python -m pydemo_runner.reference --weights DIR --prompt-ids 1,2,3,4 --max-tokens 8

prints the greedy continuation's token ids, one line, comma-separated. This file is yours:
keep it the plainest statement of your model's math.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

from .model import Model


def naive_logits(m: Model, tokens: list[int]) -> np.ndarray:
    """The logits [len(tokens), vocab] of every position, in float64."""
    c = m.c
    T, nh, nkv, d = len(tokens), c.heads, c.kv_heads, c.head_dim
    f = lambda a: None if a is None else np.asarray(a, dtype=np.float64)

    def norm(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + c.eps) * f(w)

    inv = c.inv_freq()
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x):
        h = d // 2
        return np.concatenate([x[..., :h] * cos - x[..., h:] * sin, x[..., h:] * cos + x[..., :h] * sin], axis=-1)

    x = f(m.embed)[tokens]
    for lw in m.L:
        h = norm(x, lw["attn_norm"])
        q, k, v = h @ f(lw["q"]).T, h @ f(lw["k"]).T, h @ f(lw["v"]).T
        if c.qkv_bias:
            q, k, v = q + f(lw["q_bias"]), k + f(lw["k_bias"]), v + f(lw["v_bias"])
        q, k, v = q.reshape(T, nh, d), k.reshape(T, nkv, d), v.reshape(T, nkv, d)
        if c.qk_norm:
            q, k = norm(q, lw["q_norm"]), norm(k, lw["k_norm"])
        q, k = rope(q), rope(k)
        out = np.zeros((T, nh, d))
        for head in range(nh):
            kh = head // (nh // nkv)
            for i in range(T):
                lo = 0 if c.window <= 0 else max(0, i - c.window + 1)
                s = k[lo : i + 1, kh] @ q[i, head] / math.sqrt(d)
                p = np.exp(s - s.max())
                out[i, head] = (p / p.sum()) @ v[lo : i + 1, kh]
        o = out.reshape(T, nh * d) @ f(lw["o"]).T
        if c.o_bias:
            o = o + f(lw["o_bias"])
        x = x + o
        h = norm(x, lw["mlp_norm"])
        g, u = h @ f(lw["gate"]).T, h @ f(lw["up"]).T
        x = x + (g / (1 + np.exp(-g)) * u) @ f(lw["down"]).T
    return norm(x, m.norm) @ f(m.head).T


def greedy(m: Model, prompt: list[int], max_tokens: int, ignore_eos: bool = False) -> list[int]:
    """The greedy continuation of prompt, recomputing the whole sequence per token; it stops
    early at an end-of-sequence token, as the engine does, unless ignore_eos."""
    seq, out = list(prompt), []
    eos = set(m.info().eos)
    for _ in range(max_tokens):
        tok = int(np.argmax(naive_logits(m, seq)[-1]))
        out.append(tok)
        seq.append(tok)
        if tok in eos and not ignore_eos:
            break
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pydemo_runner.reference", description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", required=True, help="directory with config.json and *.safetensors (none: seeded random weights)")
    ap.add_argument("--prompt-ids", required=True, help="comma-separated prompt token ids")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--ignore-eos", action="store_true", help="generate max-tokens tokens even past an end-of-sequence token")
    ap.add_argument("--seed", type=int, default=1, help="seed of the random weights")
    args = ap.parse_args(argv)
    try:
        prompt = [int(t) for t in args.prompt_ids.split(",")]
        m = Model(args.weights, seed=args.seed)
    except (OSError, ValueError, KeyError) as e:
        print(f"pydemo_runner.reference: {e}", file=sys.stderr)
        return 1
    print(",".join(str(t) for t in greedy(m, prompt, args.max_tokens, args.ignore_eos)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The reference Llama-family runner with its forward in PyTorch:
``python -m resin_runner.llama_torch --weights DIR [--device cpu|cuda]``.

The same model, cache layout and sampling as resin_runner.llama (numpy), with the cache
kept in torch tensors on the chosen device and the matrix products in torch. torch is not
a dependency of the package: this module needs it installed. The logits come back to numpy
for the shared sampler.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

try:
    import torch
except ImportError:  # pragma: no cover - exercised only without torch
    torch = None

from . import wire
from .llama import LlamaRunner
from .runner import StepFailed, serve_spec

NAME = "llama-torch"


class TorchLlamaRunner(LlamaRunner):
    def __init__(self, weights_dir: str, page_tokens: int = 16, max_context: int = 0, device: str = "cpu"):
        if torch is None:
            raise ValueError("resin_runner.llama_torch needs PyTorch (pip install torch)")
        super().__init__(weights_dir, page_tokens, max_context)
        self.dev = torch.device(device)
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(self.dev)  # noqa: E731
        self.t_embed, self.t_head, self.t_norm = t(self.embed), t(self.head), t(self.norm)
        self.t_layers = [{k: t(v) for k, v in lw.items()} for lw in self.L]
        self.t_cos, self.t_sin = t(self.cos), t(self.sin)
        shape = (0, page_tokens, self.c.kv_heads, self.c.head_dim)
        self.tK = [torch.zeros(shape, device=self.dev) for _ in range(self.c.layers)]
        self.tV = [torch.zeros(shape, device=self.dev) for _ in range(self.c.layers)]
        self.K = self.V = None  # the numpy cache of the base class is not used

    def info(self) -> wire.RunnerInfo:
        info = super().info()
        info.name = NAME
        return info

    def _pages(self, page_ids) -> np.ndarray:
        out = np.empty(len(page_ids), dtype=np.int64)
        for j, p in enumerate(page_ids):
            p = int(p)
            if p == wire.NO_PAGE:
                raise StepFailed("a page table holds no page where the full-attention group needs one")
            k = self.page_index.get(p)
            if k is None:
                k = self.page_index[p] = len(self.page_index)
            out[j] = k
        have = self.tK[0].shape[0]
        if len(self.page_index) > have:
            grow = max(len(self.page_index), 2 * have, 16) - have
            pad = torch.zeros((grow,) + tuple(self.tK[0].shape[1:]), device=self.dev)
            self.tK = [torch.cat([k, pad]) for k in self.tK]
            self.tV = [torch.cat([v, pad]) for v in self.tV]
        return out

    def apply_cache_ops(self, ops):
        for op in ops:
            if op.group != 0:
                raise StepFailed(f"cache op on group {op.group}; this model has one group")
            src, dst = self._pages([op.src, op.dst])
            for l in range(self.c.layers):
                self.tK[l][dst] = self.tK[l][src]
                self.tV[l][dst] = self.tV[l][src]

    def _norm(self, x, w):
        ss = x.double().square().mean(-1, keepdim=True)
        return x * torch.rsqrt(ss + self.c.eps).float() * w

    def _rope(self, x, pos):
        h = self.c.head_dim // 2
        cos, sin = self.t_cos[pos][:, None, :], self.t_sin[pos][:, None, :]
        x1, x2 = x[..., :h], x[..., h:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    @torch.no_grad() if torch is not None else (lambda f: f)
    def forward(self, plan: wire.Plan, rows: np.ndarray) -> np.ndarray:
        c = self.c
        T = len(plan.tokens)
        if T and (plan.positions.max() >= self.max_context or plan.tokens.min() < 0 or plan.tokens.max() >= c.vocab):
            raise StepFailed(f"a position beyond the context of {self.max_context} or a token outside the vocabulary")
        bt = self.page_tokens
        slots = plan.slot_mapping[0]
        if np.any(slots < 0):
            raise StepFailed("a token without a cache slot")
        slot_pages = torch.from_numpy(self._pages((slots // bt).tolist())).to(self.dev)
        slot_off = torch.from_numpy(slots % bt).to(self.dev)
        tables = [torch.from_numpy(self._pages(t.tolist())).to(self.dev) for t in plan.page_tables[0]]
        pos = torch.from_numpy(plan.positions.astype(np.int64)).to(self.dev)
        x = self.t_embed[torch.from_numpy(plan.tokens.astype(np.int64)).to(self.dev)]
        nh, nkv, d = c.heads, c.kv_heads, c.head_dim
        group = nh // nkv
        scale = 1.0 / math.sqrt(d)
        for l, lw in enumerate(self.t_layers):
            h = self._norm(x, lw["attn_norm"])
            q, k, v = h @ lw["q"].T, h @ lw["k"].T, h @ lw["v"].T
            if c.qkv_bias:
                q, k, v = q + lw["q_bias"], k + lw["k_bias"], v + lw["v_bias"]
            q, k, v = q.reshape(T, nh, d), k.reshape(T, nkv, d), v.reshape(T, nkv, d)
            if c.qk_norm:
                q, k = self._norm(q, lw["q_norm"]), self._norm(k, lw["k_norm"])
            q, k = self._rope(q, pos), self._rope(k, pos)
            self.tK[l][slot_pages, slot_off] = k
            self.tV[l][slot_pages, slot_off] = v
            att = torch.empty((T, nh, d), device=self.dev)
            for i in range(plan.num_seqs):
                a, b = int(plan.query_start[i]), int(plan.query_start[i + 1])
                ctx = int(plan.computed[i]) + b - a
                pages = tables[i]
                if len(pages) * bt < ctx:
                    raise StepFailed(f"sequence {i}: a page table of {len(pages)} pages for {ctx} tokens")
                K = self.tK[l][pages].reshape(-1, nkv, d)[:ctx].repeat_interleave(group, dim=1).transpose(0, 1)
                V = self.tV[l][pages].reshape(-1, nkv, d)[:ctx].repeat_interleave(group, dim=1).transpose(0, 1)
                s = (q[a:b].transpose(0, 1) @ K.transpose(1, 2)).double() * scale  # [heads, n, ctx]
                qpos = pos[a:b][:, None]
                kpos = torch.arange(ctx, device=self.dev)[None, :]
                mask = kpos > qpos
                if c.window > 0:
                    mask |= kpos < qpos - c.window + 1
                s = s.masked_fill(mask, float("-inf"))
                p = torch.softmax(s, dim=-1).float()
                att[a:b] = (p @ V).transpose(0, 1)
            o = att.reshape(T, nh * d) @ lw["o"].T
            if c.o_bias:
                o = o + lw["o_bias"]
            x = x + o
            h = self._norm(x, lw["mlp_norm"])
            g, u = h @ lw["gate"].T, h @ lw["up"].T
            x = x + (torch.nn.functional.silu(g) * u) @ lw["down"].T
        hr = self._norm(x[torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(self.dev)], self.t_norm)
        return (hr @ self.t_head.T).cpu().numpy()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m resin_runner.llama_torch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", required=True, help="directory with config.json and *.safetensors")
    ap.add_argument("--page-tokens", type=int, default=16, help="cache block size in tokens")
    ap.add_argument("--max-context", type=int, default=0, help="longest sequence (default: min(max_position_embeddings, 4096))")
    ap.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1, ...)")
    ap.add_argument("--listen", default=None, help="unix:PATH to listen on instead of stdin/stdout")
    args = ap.parse_args(argv)
    try:
        runner = TorchLlamaRunner(args.weights, args.page_tokens, args.max_context, args.device)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        print(f"resin_runner.llama_torch: {e}", file=sys.stderr)
        return 1
    return serve_spec(runner, args.listen)


if __name__ == "__main__":
    sys.exit(main())

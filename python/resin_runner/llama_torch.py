"""The reference Llama-family runner with its forward in PyTorch:
``python -m resin_runner.llama_torch --weights DIR [--device cpu|cuda]``.

The same model, cache layout and sampling as resin_runner.llama (numpy), with the cache
kept in torch tensors on the chosen device and the matrix products in torch. torch is not
a dependency of the package: this module needs it installed. The logits come back to numpy
for the shared sampler.
"""

from __future__ import annotations

import math
import sys

import numpy as np

try:
    import torch
except ImportError:  # pragma: no cover - exercised only without torch
    torch = None

from . import wire
from .llama import LlamaRunner, run_main

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
        # The paged cache, as the base class's, in tensors on the device.
        self.K = [t(k) for k in self.K]
        self.V = [t(v) for v in self.V]

    def info(self) -> wire.RunnerInfo:
        info = super().info()
        info.name = NAME
        return info

    def _grown(self, cache, pages: int):
        return torch.cat([cache, torch.zeros((pages,) + tuple(cache.shape[1:]), device=self.dev)])

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
        slot_pages, slot_off, tables = self._plan_cache(plan)
        dev = lambda a: torch.from_numpy(a).to(self.dev)  # noqa: E731
        slot_pages, slot_off, tables = dev(slot_pages), dev(slot_off), [dev(t) for t in tables]
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
            self.K[l][slot_pages, slot_off] = k
            self.V[l][slot_pages, slot_off] = v
            att = torch.empty((T, nh, d), device=self.dev)
            for i in range(plan.num_seqs):
                a, b = int(plan.query_start[i]), int(plan.query_start[i + 1])
                ctx = int(plan.computed[i]) + b - a
                pages = tables[i]
                K = self.K[l][pages].reshape(-1, nkv, d)[:ctx].repeat_interleave(group, dim=1).transpose(0, 1)
                V = self.V[l][pages].reshape(-1, nkv, d)[:ctx].repeat_interleave(group, dim=1).transpose(0, 1)
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
    def add_device(ap):
        ap.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1, ...)")

    return run_main("resin_runner.llama_torch", __doc__,
                    lambda a: TorchLlamaRunner(a.weights, a.page_tokens, a.max_context, a.device), argv,
                    add_args=add_device, errors=(OSError, ValueError, KeyError, RuntimeError))


if __name__ == "__main__":
    sys.exit(main())

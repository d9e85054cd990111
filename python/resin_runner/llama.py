"""A reference Llama-family runner in numpy: ``python -m resin_runner.llama --weights DIR``.

It reads DIR/config.json and DIR/*.safetensors (Llama, Qwen2, Qwen3 and Mistral variants:
attention biases, per-head q/k norm, sliding window, rope scaling default/linear/llama3)
and keeps its paged KV cache in numpy arrays addressed by the plan's slot mappings
(slot = page * page_tokens + position % page_tokens). It speaks the protocol on
stdin/stdout, or on a Unix socket with --listen unix:PATH. It is the math of the Go
reference forward (models/llama), written for clarity rather than speed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

from . import wire
from .runner import Runner, StepFailed, serve_spec
from .safetensors import load_dir
from .sampling import sample_plan

NAME = "llama"


class Config:
    def __init__(self, raw: dict):
        self.raw = raw
        mt = raw.get("model_type") or {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
                                       "MistralForCausalLM": "mistral"}.get((raw.get("architectures") or [""])[0], "")
        if mt not in ("llama", "qwen2", "qwen3", "mistral"):
            raise ValueError(f"config: model_type {mt!r} is not a Llama-family model this runner implements")
        self.model_type = mt
        self.vocab = int(raw["vocab_size"])
        self.hidden = int(raw["hidden_size"])
        self.inter = int(raw["intermediate_size"])
        self.layers = int(raw["num_hidden_layers"])
        self.heads = int(raw["num_attention_heads"])
        self.kv_heads = int(raw.get("num_key_value_heads") or self.heads)
        hd = raw.get("head_dim")
        if hd is None:
            hd = 128 if mt == "qwen3" else self.hidden // self.heads
        self.head_dim = int(hd)
        self.eps = float(raw.get("rms_norm_eps", 1e-6))
        self.theta = float(raw.get("rope_theta", 10000.0))
        self.rope_scaling = raw.get("rope_scaling") or None
        self.max_pos = int(raw.get("max_position_embeddings", 4096))
        self.tie = bool(raw.get("tie_word_embeddings", False))
        bias = bool(raw.get("attention_bias", False))
        self.qkv_bias = True if mt == "qwen2" else bias
        self.o_bias = False if mt == "qwen2" else bias
        self.qk_norm = mt == "qwen3"
        self.window = 0
        if mt == "mistral":
            self.window = int(raw["sliding_window"]) if raw.get("sliding_window") is not None else (0 if "sliding_window" in raw else 4096)
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config: hidden_act {raw.get('hidden_act')!r} is not implemented (SwiGLU uses silu)")
        eos = raw.get("eos_token_id")
        self.eos = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])

    def inv_freq(self) -> np.ndarray:
        d = self.head_dim
        inv = np.array([math.pow(self.theta, -2 * i / d) for i in range(d // 2)], dtype=np.float64)
        rs = self.rope_scaling
        kind = (rs or {}).get("rope_type") or (rs or {}).get("type") or "default"
        if kind == "default":
            return inv
        if kind == "linear":
            return inv / float(rs["factor"])
        if kind == "llama3":
            f, lo, hi, old = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"]), float(rs["original_max_position_embeddings"])
            low_wave, high_wave = old / lo, old / hi
            out = inv.copy()
            for i, fr in enumerate(inv):
                wave = 2 * math.pi / fr
                if wave < high_wave:
                    continue
                if wave > low_wave:
                    out[i] = fr / f
                else:
                    s = (old / wave - lo) / (hi - lo)
                    out[i] = (1 - s) * fr / f + s * fr
            return out
        raise ValueError(f"config: rope_scaling type {kind!r} is not implemented")


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x: [..., dim]; the sum of squares in float64, as the Go reference does."""
    ss = np.mean(np.square(x.astype(np.float64)), axis=-1, keepdims=True)
    inv = (1.0 / np.sqrt(ss + eps)).astype(np.float32)
    return (x * inv) * w


class LlamaRunner(Runner):
    # sample_plan applies the steps' token masks (grammar-constrained requests).
    caps = Runner.caps | wire.CAP_TOKEN_MASKS

    def __init__(self, weights_dir: str, page_tokens: int = 16, max_context: int = 0):
        with open(os.path.join(weights_dir, "config.json")) as f:
            self.c = c = Config(json.load(f))
        self.page_tokens = page_tokens
        self.max_context = max_context or (min(c.max_pos, 4096) if c.max_pos > 1 else 4096)
        t = load_dir(weights_dir)
        self.w = t

        def get(name):
            if name not in t:
                raise ValueError(f"{weights_dir}: tensor {name} is missing")
            return np.ascontiguousarray(t[name], dtype=np.float32)

        self.embed = get("model.embed_tokens.weight")
        self.head = self.embed if c.tie and "lm_head.weight" not in t else get("lm_head.weight")
        self.norm = get("model.norm.weight")
        self.L = []
        for i in range(c.layers):
            p = f"model.layers.{i}."
            lw = {k: get(p + n) for k, n in (
                ("attn_norm", "input_layernorm.weight"), ("q", "self_attn.q_proj.weight"), ("k", "self_attn.k_proj.weight"),
                ("v", "self_attn.v_proj.weight"), ("o", "self_attn.o_proj.weight"), ("mlp_norm", "post_attention_layernorm.weight"),
                ("gate", "mlp.gate_proj.weight"), ("up", "mlp.up_proj.weight"), ("down", "mlp.down_proj.weight"))}
            if c.qkv_bias:
                for k in ("q", "k", "v"):
                    lw[k + "_bias"] = get(p + f"self_attn.{k}_proj.bias")
            if c.o_bias:
                lw["o_bias"] = get(p + "self_attn.o_proj.bias")
            if c.qk_norm:
                lw["q_norm"] = get(p + "self_attn.q_norm.weight")
                lw["k_norm"] = get(p + "self_attn.k_norm.weight")
            self.L.append(lw)
        ang = np.arange(self.max_context, dtype=np.float64)[:, None] * c.inv_freq()[None, :]
        self.cos = np.cos(ang).astype(np.float32)  # [max_context, head_dim/2]
        self.sin = np.sin(ang).astype(np.float32)
        # The paged cache: page id -> index into K/V [layers][pages, page_tokens, kv_heads, head_dim].
        self.page_index: dict[int, int] = {}
        shape = (0, page_tokens, c.kv_heads, c.head_dim)
        self.K = [np.zeros(shape, np.float32) for _ in range(c.layers)]
        self.V = [np.zeros(shape, np.float32) for _ in range(c.layers)]

    def info(self) -> wire.RunnerInfo:
        c = self.c
        eos = [e for e in c.eos if 0 <= e < c.vocab]
        group = wire.CacheGroup("kv", wire.KIND_FULL, c.layers, 2 * c.kv_heads * c.head_dim * 4, self.page_tokens)
        return wire.RunnerInfo(NAME, c.vocab, self.max_context, eos, [group])

    # --- the cache -----------------------------------------------------------------------

    def _pages(self, page_ids) -> np.ndarray:
        """Indices of pages in K/V, adding the pages not seen yet."""
        out = np.empty(len(page_ids), dtype=np.int64)
        for j, p in enumerate(page_ids):
            p = int(p)
            if p == wire.NO_PAGE:
                raise StepFailed("a page table holds no page where the full-attention group needs one")
            k = self.page_index.get(p)
            if k is None:
                k = self.page_index[p] = len(self.page_index)
            out[j] = k
        have = self.K[0].shape[0]
        if len(self.page_index) > have:
            grow = max(len(self.page_index), 2 * have, 16) - have
            self.K = [self._grown(k, grow) for k in self.K]
            self.V = [self._grown(v, grow) for v in self.V]
        return out

    def _grown(self, cache, pages: int):
        """cache [pages, page_tokens, kv_heads, head_dim] with pages more zero pages."""
        return np.concatenate([cache, np.zeros((pages,) + cache.shape[1:], np.float32)])

    def apply_cache_ops(self, ops):
        for op in ops:
            if op.group != 0:
                raise StepFailed(f"cache op on group {op.group}; this model has one group")
            src, dst = self._pages([op.src, op.dst])
            for l in range(self.c.layers):
                self.K[l][dst] = self.K[l][src]
                self.V[l][dst] = self.V[l][src]

    # --- the forward ---------------------------------------------------------------------

    def _plan_cache(self, plan: wire.Plan):
        """Checks the plan's tokens and positions against the model and its page tables
        against the tokens they must hold; returns the K/V page index and in-page offset of
        each token's slot and each sequence's K/V page indices."""
        c, bt = self.c, self.page_tokens
        if len(plan.tokens) and (plan.positions.max() >= self.max_context or plan.tokens.min() < 0 or plan.tokens.max() >= c.vocab):
            raise StepFailed(f"a position beyond the context of {self.max_context} or a token outside the vocabulary")
        slots = plan.slot_mapping[0]
        if np.any(slots < 0):
            raise StepFailed("a token without a cache slot")
        slot_pages = self._pages((slots // bt).tolist())
        tables = [self._pages(t.tolist()) for t in plan.page_tables[0]]
        for i, pages in enumerate(tables):
            ctx = int(plan.computed[i]) + int(plan.query_start[i + 1]) - int(plan.query_start[i])
            if len(pages) * bt < ctx:
                raise StepFailed(f"sequence {i}: a page table of {len(pages)} pages for {ctx} tokens")
        return slot_pages, slots % bt, tables

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """x: [T, heads, head_dim], NeoX halves: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s)."""
        h = self.c.head_dim // 2
        cos, sin = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        x1, x2 = x[..., :h], x[..., h:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def forward(self, plan: wire.Plan, rows: np.ndarray) -> np.ndarray:
        """Runs the plan's tokens, storing their K/V at the plan's slots, and returns the
        logits [len(rows), vocab] of the token rows named by rows."""
        c = self.c
        T = len(plan.tokens)
        slot_pages, slot_off, tables = self._plan_cache(plan)
        pos = plan.positions.astype(np.int64)
        x = self.embed[plan.tokens]
        nh, nkv, d = c.heads, c.kv_heads, c.head_dim
        group = nh // nkv
        scale = 1.0 / math.sqrt(d)
        for l, lw in enumerate(self.L):
            h = rms_norm(x, lw["attn_norm"], c.eps)
            q, k, v = h @ lw["q"].T, h @ lw["k"].T, h @ lw["v"].T
            if c.qkv_bias:
                q, k, v = q + lw["q_bias"], k + lw["k_bias"], v + lw["v_bias"]
            q, k, v = q.reshape(T, nh, d), k.reshape(T, nkv, d), v.reshape(T, nkv, d)
            if c.qk_norm:
                q, k = rms_norm(q, lw["q_norm"], c.eps), rms_norm(k, lw["k_norm"], c.eps)
            q, k = self._rope(q, pos), self._rope(k, pos)
            self.K[l][slot_pages, slot_off] = k
            self.V[l][slot_pages, slot_off] = v
            att = np.empty((T, nh, d), np.float32)
            for i in range(plan.num_seqs):
                a, b = int(plan.query_start[i]), int(plan.query_start[i + 1])
                ctx = int(plan.computed[i]) + b - a
                pages = tables[i]
                K = self.K[l][pages].reshape(-1, nkv, d)[:ctx]  # [ctx, kv_heads, d]
                V = self.V[l][pages].reshape(-1, nkv, d)[:ctx]
                Kh = np.repeat(K, group, axis=1).transpose(1, 0, 2)  # [heads, ctx, d]
                Vh = np.repeat(V, group, axis=1).transpose(1, 0, 2)
                qh = q[a:b].transpose(1, 0, 2)  # [heads, n, d]
                s = (qh @ Kh.transpose(0, 2, 1)).astype(np.float64) * scale  # [heads, n, ctx]
                qpos = pos[a:b][:, None]
                kpos = np.arange(ctx)[None, :]
                mask = kpos > qpos
                if c.window > 0:
                    mask |= kpos < qpos - c.window + 1
                s[:, mask] = -np.inf
                s -= s.max(axis=-1, keepdims=True)
                p = np.exp(s)
                p /= p.sum(axis=-1, keepdims=True)
                att[a:b] = (p.astype(np.float32) @ Vh).transpose(1, 0, 2)
            o = att.reshape(T, nh * d) @ lw["o"].T
            if c.o_bias:
                o = o + lw["o_bias"]
            x = x + o
            h = rms_norm(x, lw["mlp_norm"], c.eps)
            g, u = h @ lw["gate"].T, h @ lw["up"].T
            g = g / (1.0 + np.exp(-g)) * u
            x = x + g @ lw["down"].T
        hr = rms_norm(x[rows], self.norm, c.eps)
        return hr @ self.head.T

    def execute(self, plan: wire.Plan) -> wire.StepResult:
        if np.any(plan.num_drafts):
            raise StepFailed("this runner proposes no drafts and verifies none")
        scoring = any(plan.prompt_rows(i) > 0 for i in range(plan.num_seqs))
        rows = np.arange(len(plan.tokens)) if scoring else plan.logits_indices
        logits = self.forward(plan, rows)
        return sample_plan(plan, logits, all_rows=scoring)


def run_main(module: str, doc: str, make, argv=None, add_args=None, errors=(OSError, ValueError, KeyError)) -> int:
    """The command line of a Llama runner module: parses argv (the shared flags, and those
    add_args adds), builds the runner with make(args) and serves it. A runner that cannot
    be built (an exception in errors) is reported on stderr, exit status 1."""
    ap = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0])
    ap.add_argument("--weights", required=True, help="directory with config.json and *.safetensors")
    ap.add_argument("--page-tokens", type=int, default=16, help="cache block size in tokens")
    ap.add_argument("--max-context", type=int, default=0, help="longest sequence (default: min(max_position_embeddings, 4096))")
    if add_args is not None:
        add_args(ap)
    ap.add_argument("--listen", default=None, help="unix:PATH to listen on instead of stdin/stdout")
    args = ap.parse_args(argv)
    try:
        runner = make(args)
    except errors as e:
        print(f"{module}: {e}", file=sys.stderr)
        return 1
    return serve_spec(runner, args.listen)


def main(argv=None) -> int:
    return run_main("resin_runner.llama", __doc__, lambda a: LlamaRunner(a.weights, a.page_tokens, a.max_context), argv)


if __name__ == "__main__":
    sys.exit(main())
